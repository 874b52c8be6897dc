"""Combinators: plain functions that build an :class:`Algorithm` from algorithms.

``chain`` and ``named_chain`` run several algorithms as one; ``on_events``, ``during``,
``every_n_steps`` and ``when`` gate one algorithm. Every result is an ``Algorithm`` (so it
nests), declares the OR of its parts' flags, and lists its parts in ``parts`` so that
``init_state`` stores each part's own state under the part's own name.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any

from sbfunc.engine.algorithm import FLAGS, Algorithm, ApplyResult
from sbfunc.engine.events import Event
from sbfunc.engine.state import State

__all__ = ["chain", "during", "every_n_steps", "named_chain", "on_events", "when"]


def _check_algorithm(alg: object, arg: str) -> Algorithm:
    if not isinstance(alg, Algorithm):
        raise TypeError(f"{arg} must be an sbfunc Algorithm, got {type(alg).__name__}")
    return alg


def _inherit_flags(target: Algorithm, parts: Iterable[Algorithm]) -> None:
    parts = tuple(parts)
    for flag in FLAGS:
        setattr(target, flag, any(getattr(p, flag) for p in parts))


def _renamed(alg: Algorithm, name: str) -> Algorithm:
    """A shallow copy of ``alg`` called ``name`` (the caller's object is never renamed)."""
    if alg.name == name:
        return alg
    twin = copy.copy(alg)
    twin.name = name
    return twin


def unique_names(names: Iterable[str]) -> list[str]:
    """Make names unique by suffixing repeats ``#1``, ``#2``, ... in order of appearance.

    Args:
        names: names, possibly repeated.

    Returns:
        The names, the first occurrence of each unchanged.

    Example:
        >>> from sbfunc.engine.combinators import unique_names
        >>> unique_names(["a", "b", "a", "a"])
        ['a', 'b', 'a#1', 'a#2']

    References:
        MosaicML Composer engine traces (names keyed per algorithm).
    """
    seen: dict[str, int] = {}
    taken = set()
    out = []
    for name in names:
        label, k = name, seen.get(name, 0)
        while label in taken:
            k += 1
            label = f"{name}#{k}"
        seen[name] = k
        taken.add(label)
        out.append(label)
    return out


class _Chain(Algorithm):
    """Runs its parts in order; each part is matched on the state its predecessors left."""

    def __init__(self, parts: tuple[Algorithm, ...], name: str) -> None:
        self.parts = parts
        self.name = name
        _inherit_flags(self, parts)

    def match(self, event: Event, state: State) -> bool:
        return any(p.match(event, state) for p in self.parts)

    def apply(self, event: Event, state: State) -> ApplyResult:
        code = None
        for part in self.parts:
            if part.match(event, state):
                result = part.apply(event, state)
                if type(result) is State:
                    state = result
                else:
                    state, part_code = result  # type: ignore[misc]
                    code = part_code if part_code is not None else code
        return state if code is None else (state, code)

    def __repr__(self) -> str:
        return f"chain({', '.join(map(repr, self.parts))}, name={self.name!r})"


def chain(*algorithms: Algorithm, name: str = "chain") -> Algorithm:
    """Run ``algorithms`` in order as a single algorithm.

    It matches when any part matches; applying it applies, in order, each part that matches
    the state left by the parts before it, so ``chain()`` never runs and
    ``chain(a, chain(b, c))`` has the effect of ``chain(chain(a, b), c)``. (Parts' ``match``
    is called twice per event, once to decide and once on the running state: keep it pure.)
    Parts that share a name are renamed ``name#1``, ``name#2``... (on copies, in order), so
    each keeps its own entry in ``state.algorithm_state``. The last exit code a part reports
    becomes the chain's.

    Args:
        *algorithms: the parts.
        name: the chain's name in traces.

    Returns:
        An :class:`Algorithm` whose flags are the OR of its parts' flags.

    Raises:
        TypeError: if a part is not an ``Algorithm`` or ``name`` is not a non-empty str.

    Example:
        >>> from sbfunc.engine import Event, chain, init_state
        >>> from sbfunc.testing import Toy
        >>> both = chain(Toy(tag=1), Toy(tag=2))
        >>> [p.name for p in both.parts]
        ['Toy', 'Toy#1']
        >>> state = init_state({}, {}, key=sbfunc.random.key(0))
        >>> both.apply(Event.INIT, state).algorithm_state["log"]
        (1, 2)

    References:
        optax ``chain``; MosaicML Composer algorithm lists.
    """
    parts = tuple(_check_algorithm(a, f"algorithms[{i}]") for i, a in enumerate(algorithms))
    names = unique_names(p.name for p in parts)
    return _Chain(tuple(_renamed(p, n) for p, n in zip(parts, names, strict=True)), name)


def named_chain(*pairs: tuple[str, Algorithm], **algorithms: Algorithm) -> Algorithm:
    """Like :func:`chain`, naming each part: ``named_chain(a=x, b=y)`` or ``(("a", x), ...)``.

    Parts are renamed on copies; their state lives under the given names.

    Args:
        *pairs: ``(name, algorithm)`` pairs, in order.
        **algorithms: ``name=algorithm``, in order, after the pairs.

    Returns:
        An :class:`Algorithm` (named ``"named_chain"``).

    Raises:
        TypeError: if a pair is not ``(str, Algorithm)``.
        ValueError: if a name is used twice.

    Example:
        >>> from sbfunc.engine import named_chain
        >>> from sbfunc.testing import Toy
        >>> [p.name for p in named_chain(first=Toy(), second=Toy()).parts]
        ['first', 'second']

    References:
        optax ``named_chain``.
    """
    items = list(pairs) + list(algorithms.items())
    parts = []
    for i, item in enumerate(items):
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            raise TypeError(f"pairs[{i}] must be a (name: str, algorithm) pair, got {item!r}")
        parts.append(_renamed(_check_algorithm(item[1], f"algorithm {item[0]!r}"), item[0]))
    names = [p.name for p in parts]
    if len(set(names)) != len(names):
        raise ValueError(f"named_chain names must be unique, got {names}")
    return _Chain(tuple(parts), "named_chain")


class _Gated(Algorithm):
    """Runs ``part`` only while ``gate(event, state)`` holds; same name and flags as ``part``."""

    def __init__(
        self, part: Algorithm, gate: Callable[[Event, State], bool], description: str
    ) -> None:
        self.part = part
        self.parts = (part,)
        self.gate = gate
        self.description = description
        _inherit_flags(self, self.parts)

    @property
    def name(self) -> str:
        return self.part.name

    @name.setter
    def name(self, value: str) -> None:
        # Only ever called on a copy (see _renamed): rename a copy of the part too.
        self.part = _renamed(self.part, value)
        self.parts = (self.part,)

    def match(self, event: Event, state: State) -> bool:
        return self.gate(event, state) and self.part.match(event, state)

    def apply(self, event: Event, state: State) -> ApplyResult:
        return self.part.apply(event, state)

    def __repr__(self) -> str:
        return f"{self.description[:-1]}, part={self.part!r})"


def on_events(algorithm: Algorithm, events: Iterable[Event]) -> Algorithm:
    """Restrict ``algorithm`` to ``events`` (it still has to match them itself).

    Args:
        algorithm: the algorithm to gate.
        events: the events it may run on (an empty collection: never).

    Returns:
        An :class:`Algorithm` with ``algorithm``'s name and flags.

    Raises:
        TypeError: if ``algorithm`` is not an ``Algorithm`` or an event is not an ``Event``.

    Example:
        >>> from sbfunc.engine import Event, init_state, on_events
        >>> from sbfunc.testing import Toy
        >>> alg = on_events(Toy(), [Event.BATCH_END])
        >>> state = init_state({}, {}, key=sbfunc.random.key(0))
        >>> alg.match(Event.BATCH_END, state), alg.match(Event.INIT, state)
        (True, False)

    References:
        MosaicML Composer ``Algorithm.match`` on events.
    """
    _check_algorithm(algorithm, "algorithm")
    allowed = frozenset(events)
    for e in allowed:
        if not isinstance(e, Event):
            raise TypeError(f"events must hold sbfunc Events, got {e!r}")
    names = sorted(e.name for e in allowed)
    return _Gated(algorithm, lambda event, state: event in allowed, f"on_events({names})")


def _check_fraction(value: float, arg: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ValueError(f"{arg} must be a fraction of training in [0, 1], got {value!r}")
    return float(value)


def during(algorithm: Algorithm, start: float, end: float) -> Algorithm:
    """Run ``algorithm`` only while ``start <= state.time.elapsed < end`` (half-open).

    Args:
        algorithm: the algorithm to gate.
        start: first active fraction of training, in ``[0, 1]``.
        end: first inactive fraction, in ``[start, 1]``; ``end == start`` never runs.

    Returns:
        An :class:`Algorithm` with ``algorithm``'s name and flags.

    Raises:
        TypeError: if ``algorithm`` is not an ``Algorithm``.
        ValueError: if ``start`` or ``end`` is outside ``[0, 1]`` or ``end < start``.

    Example:
        >>> from sbfunc.engine import Event, Time, during, init_state
        >>> from sbfunc.testing import Toy
        >>> alg = during(Toy(), 0.5, 0.9)
        >>> state = init_state({}, {}, key=sbfunc.random.key(0))
        >>> [alg.match(Event.INIT, state.replace(time=Time(elapsed=t))) for t in (0.4, 0.5, 0.9)]
        [False, True, False]

    References:
        MosaicML Composer ``should_selective_backprop`` window; optax schedules.
    """
    _check_algorithm(algorithm, "algorithm")
    lo, hi = _check_fraction(start, "start"), _check_fraction(end, "end")
    if hi < lo:
        raise ValueError(f"end must be in [start, 1] = [{lo}, 1], got {end!r}")
    return _Gated(
        algorithm,
        lambda event, state: lo <= state.time.elapsed < hi,
        f"during(start={lo}, end={hi})",
    )


def every_n_steps(algorithm: Algorithm, n: int, offset: int = 0) -> Algorithm:
    """Run ``algorithm`` only at steps ``offset, offset + n, offset + 2n, ...``.

    Args:
        algorithm: the algorithm to gate.
        n: the period in optimizer steps (``state.time.step``), ``>= 1``.
        offset: the first active step, ``>= 0``.

    Returns:
        An :class:`Algorithm` with ``algorithm``'s name and flags.

    Raises:
        TypeError: if ``algorithm`` is not an ``Algorithm``.
        ValueError: if ``n < 1`` or ``offset < 0`` (or either is not an int).

    Example:
        >>> from sbfunc.engine import Event, Time, every_n_steps, init_state
        >>> from sbfunc.testing import Toy
        >>> alg = every_n_steps(Toy(), 3, offset=1)
        >>> state = init_state({}, {}, key=sbfunc.random.key(0))
        >>> [s for s in range(8) if alg.match(Event.INIT, state.replace(time=Time(step=s)))]
        [1, 4, 7]

    References:
        optax ``MultiSteps``; PyTorch Lightning ``every_n_train_steps``.
    """
    _check_algorithm(algorithm, "algorithm")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be an int >= 0, got {offset!r}")

    def gate(event: Event, state: State) -> bool:
        step = state.time.step
        return step >= offset and (step - offset) % n == 0

    return _Gated(algorithm, gate, f"every_n_steps(n={n}, offset={offset})")


def when(algorithm: Algorithm, predicate: Callable[[State], Any]) -> Algorithm:
    """Run ``algorithm`` only when ``predicate(state)`` is true.

    Args:
        algorithm: the algorithm to gate.
        predicate: a pure function of the state (called once per event, before ``match``).

    Returns:
        An :class:`Algorithm` with ``algorithm``'s name and flags.

    Raises:
        TypeError: if ``algorithm`` is not an ``Algorithm`` or ``predicate`` is not callable.

    Example:
        >>> from sbfunc.engine import Event, Time, init_state, when
        >>> from sbfunc.testing import Toy
        >>> alg = when(Toy(), lambda s: s.time.epoch >= 2)
        >>> state = init_state({}, {}, key=sbfunc.random.key(0))
        >>> alg.match(Event.INIT, state), alg.match(Event.INIT, state.replace(time=Time(epoch=2)))
        (False, True)

    References:
        optax ``conditionally_transform``.
    """
    _check_algorithm(algorithm, "algorithm")
    if not callable(predicate):
        raise TypeError(f"predicate must be callable (state -> bool), got {predicate!r}")
    return _Gated(algorithm, lambda event, state: bool(predicate(state)), f"when({predicate!r})")
