"""Combinators: plain functions that build an :class:`Algorithm` from algorithms.

``sequence`` and ``named_sequence`` run several algorithms as one; their state is the tuple (or,
for ``named_sequence``, the dict) of their parts' states, so state mirrors the structure of the
algorithms and two parts can never collide. ``on_events``, ``during``, ``every_n_steps`` and
``when`` gate one algorithm and are transparent: same name, state, key and flags as the part.
Every result is an ``Algorithm`` (so it nests) and lists its parts in ``parts``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from sbfunc import random as sbrandom
from sbfunc._frozen import replaced
from sbfunc.engine._algorithm import FLAGS, Algorithm, ApplyResult
from sbfunc.engine._events import Event
from sbfunc.engine._state import Context
from sbfunc.engine._trace import stream_ids, unpack_result
from sbfunc.validation import check_fraction, check_int

__all__ = ["during", "every_n_steps", "named_sequence", "on_events", "sequence", "when"]


def _check_algorithm(alg: object, arg: str) -> Algorithm:
    if not isinstance(alg, Algorithm):
        raise TypeError(f"{arg} must be an sbfunc Algorithm, got {type(alg).__name__}")
    return alg


def _inherited(parts: tuple[Algorithm, ...]) -> dict[str, Any]:
    """The flags (each the OR of the parts') and the events (the union) of a combinator."""
    flags: dict[str, Any] = {
        flag: any(getattr(p, flag) for p in parts) for flag in (*FLAGS, "uses_key", "uses_elapsed")
    }
    listened = [p.events for p in parts]
    flags["events"] = None if None in listened else frozenset().union(*listened)  # type: ignore[arg-type]
    return flags


class SequenceAlgorithm(Algorithm):
    """Runs its parts in order as one algorithm; state: its parts' states."""

    def __init__(
        self, parts: tuple[Algorithm, ...], name: str, names: tuple[str, ...] | None
    ) -> None:
        self.parts = parts
        self.name = name
        self.names = names
        self.streams = stream_ids([p.name for p in parts] if names is None else names)
        for field, value in _inherited(parts).items():
            setattr(self, field, value)

    def _pack(self, values: Iterable[Any]) -> Any:
        values = tuple(values)
        return values if self.names is None else dict(zip(self.names, values, strict=True))

    def _items(self, packed: Any) -> list[Any]:
        if packed is None:
            return [None] * len(self.parts)
        return list(packed if self.names is None else packed.values())

    def init(self, key: Any) -> Any:
        return self._pack(
            p.init(sbrandom.fold_in(key, s)) for p, s in zip(self.parts, self.streams, strict=True)
        )

    def match(self, event: Event, ctx: Context) -> Any:
        own, scratch = self._items(ctx.own), self._items(ctx.scratch)
        decisions = tuple(
            p.match(event, ctx.replace(own=own[i], scratch=scratch[i]))
            for i, p in enumerate(self.parts)
        )
        return decisions if any(decisions) else False

    def apply(self, event: Event, ctx: Context) -> ApplyResult:
        decisions = ctx.matched
        own, scratch = self._items(ctx.own), self._items(ctx.scratch)
        key, code = ctx.key, None
        for i, part in enumerate(self.parts):
            if not decisions[i]:
                continue
            part_key = (
                None
                if key is None or not part.uses_key
                else sbrandom.fold_in(key, self.streams[i])
            )
            view = ctx.replace(own=own[i], scratch=scratch[i], matched=decisions[i], key=part_key)
            out, part_code = unpack_result(part.apply(event, view), part)
            own[i], scratch[i] = out.own, out.scratch
            code = part_code if part_code is not None else code
            ctx = out
        ctx = ctx.replace(
            own=self._pack(own), scratch=self._pack(scratch), matched=decisions, key=key
        )
        return ctx if code is None else (ctx, code)

    def for_step(self, *, loss_fn: Any, per_sample: Any) -> Algorithm:
        parts = tuple(p.for_step(loss_fn=loss_fn, per_sample=per_sample) for p in self.parts)
        if all(new is old for new, old in zip(parts, self.parts, strict=True)):
            return self
        return SequenceAlgorithm(parts, self.name, self.names)

    def __repr__(self) -> str:
        parts = self.parts if self.names is None else zip(self.names, self.parts, strict=True)
        return f"sequence({', '.join(map(repr, parts))}, name={self.name!r})"


def sequence(*algorithms: Algorithm, name: str = "sequence") -> Algorithm:
    """Run ``algorithms`` in order as a single algorithm.

    It matches when any part matches (its decision is the tuple of the parts' decisions) and
    applies, in order, each part that matched. Its state is the tuple of its parts' states and
    each part draws from its own stream (derived from the sequence's key and the part's name and
    rank among same-named parts). The last exit code a part reports becomes the sequence's.

    Args:
        *algorithms: the parts.
        name: the sequence's name in traces.

    Returns:
        An :class:`Algorithm` whose flags are the OR of its parts' flags.

    Raises:
        TypeError: if a part is not an ``Algorithm``.

    Example:
        >>> from sbfunc.engine import Event, sequence
        >>> from sbfunc.testing import Toy
        >>> both = sequence(Toy(tag=1), Toy(tag=2))
        >>> ctx = sbfunc.Context(sbfunc.random.key(0), own=both.init(sbfunc.random.key(0)))
        >>> decision = both.match(Event.INIT, ctx)
        >>> both.apply(Event.INIT, ctx.replace(matched=decision)).own  # each Toy logs its tag
        ((1,), (2,))

    References:
        optax ``sequence``; MosaicML Composer algorithm lists.
    """
    parts = tuple(_check_algorithm(a, f"algorithms[{i}]") for i, a in enumerate(algorithms))
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    return SequenceAlgorithm(parts, name, None)


def named_sequence(*pairs: tuple[str, Algorithm], **algorithms: Algorithm) -> Algorithm:
    """Like :func:`sequence`, with named parts: ``named_sequence(a=x, b=y)`` or
    ``(("a", x), ...)``.

    Its state is a dict of the parts' states by those names, and each part's random stream is
    derived from its given name.

    Args:
        *pairs: ``(name, algorithm)`` pairs, in order.
        **algorithms: ``name=algorithm``, in order, after the pairs.

    Returns:
        An :class:`Algorithm` named ``"named_sequence"``.

    Raises:
        TypeError: if a pair is not ``(str, Algorithm)``.
        ValueError: if a name is used twice.

    Example:
        >>> from sbfunc.engine import named_sequence
        >>> from sbfunc.testing import Toy
        >>> named_sequence(first=Toy(), second=Toy()).init(sbfunc.random.key(0))
        {'first': (), 'second': ()}

    References:
        optax ``named_sequence``.
    """
    items = list(pairs) + list(algorithms.items())
    names, parts = [], []
    for i, item in enumerate(items):
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            raise TypeError(f"pairs[{i}] must be a (name: str, algorithm) pair, got {item!r}")
        names.append(item[0])
        parts.append(_check_algorithm(item[1], f"algorithm {item[0]!r}"))
    if len(set(names)) != len(names):
        raise ValueError(f"named_sequence names must be unique, got {names}")
    return SequenceAlgorithm(tuple(parts), "named_sequence", tuple(names))


class _Gated(Algorithm):
    """Runs ``part`` only while ``gate(event, ctx)`` holds; same name, state and flags.

    ``only`` narrows the events the part listens to; ``elapsed`` says the gate reads
    ``time.elapsed`` (so the step needs the run's length).
    """

    def __init__(
        self,
        part: Algorithm,
        gate: Callable[[Event, Context], bool],
        description: str,
        *,
        only: frozenset[Event] | None = None,
        elapsed: bool = False,
    ) -> None:
        self.part = part
        self.parts = (part,)
        self.gate = gate
        self.description = description
        self.only, self.elapsed = only, elapsed
        self.name = part.name
        for field, value in _inherited(self.parts).items():
            setattr(self, field, value)
        if only is not None:
            self.events = only if part.events is None else only & part.events
        self.uses_elapsed = self.uses_elapsed or elapsed

    def init(self, key: Any) -> Any:
        return self.part.init(key)

    def match(self, event: Event, ctx: Context) -> Any:
        return self.gate(event, ctx) and self.part.match(event, ctx)

    def apply(self, event: Event, ctx: Context) -> ApplyResult:
        return self.part.apply(event, ctx)

    def for_step(self, *, loss_fn: Any, per_sample: Any) -> Algorithm:
        part = self.part.for_step(loss_fn=loss_fn, per_sample=per_sample)
        if part is self.part:
            return self
        gated = _Gated(part, self.gate, self.description, only=self.only, elapsed=self.elapsed)
        return gated if gated.name == self.name else replaced(gated, name=self.name)

    def __repr__(self) -> str:
        return f"{self.description[:-1]}, part={self.part!r})"


def on_events(algorithm: Algorithm, events: Iterable[Event]) -> Algorithm:
    """Restrict ``algorithm`` to ``events`` (it still has to match them itself).

    Args:
        algorithm: the algorithm to gate.
        events: the events it may run on (an empty collection: never).

    Returns:
        An :class:`Algorithm` with ``algorithm``'s name, state and flags.

    Raises:
        TypeError: if ``algorithm`` is not an ``Algorithm`` or an event is not an ``Event``.

    Example:
        >>> from sbfunc.engine import Event, on_events
        >>> from sbfunc.testing import Toy
        >>> alg = on_events(Toy(), [Event.BATCH_END])
        >>> ctx = sbfunc.Context(sbfunc.random.key(0))
        >>> alg.match(Event.BATCH_END, ctx), alg.match(Event.INIT, ctx)
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
    return _Gated(
        algorithm, lambda event, state: event in allowed, f"on_events({names})", only=allowed
    )


def during(algorithm: Algorithm, start: float, end: float) -> Algorithm:
    """Run ``algorithm`` only while ``start <= state.time.elapsed < end`` (half-open).

    Args:
        algorithm: the algorithm to gate.
        start: first active fraction of training, in ``[0, 1]``.
        end: first inactive fraction, in ``[start, 1]``; ``end == start`` never runs.

    Returns:
        An :class:`Algorithm` with ``algorithm``'s name, state and flags.

    Raises:
        TypeError: if ``algorithm`` is not an ``Algorithm``, or ``start``/``end`` is not a
            number.
        ValueError: if ``start`` or ``end`` is outside ``[0, 1]`` (NaN included) or
            ``end < start``.

    Example:
        >>> from sbfunc.engine import Event, during
        >>> from sbfunc.testing import Toy
        >>> alg = during(Toy(), 0.5, 0.9)
        >>> ctx = sbfunc.Context(sbfunc.random.key(0))
        >>> [alg.match(Event.INIT, ctx.replace(time=sbfunc.Time(elapsed=t)))
        ...  for t in (0.4, 0.5, 0.9)]
        [False, True, False]

    References:
        MosaicML Composer ``should_selective_backprop`` window; optax schedules.
    """
    _check_algorithm(algorithm, "algorithm")
    lo, hi = check_fraction(start, "start"), check_fraction(end, "end")
    if hi < lo:
        raise ValueError(f"end must be in [start, 1] = [{lo}, 1], got {end!r}")
    return _Gated(
        algorithm,
        lambda event, state: lo <= state.time.elapsed < hi,
        f"during(start={lo}, end={hi})",
        elapsed=(lo, hi) != (0.0, 1.0),
    )


def every_n_steps(algorithm: Algorithm, n: int, offset: int = 0) -> Algorithm:
    """Run ``algorithm`` only at steps ``offset, offset + n, offset + 2n, ...``.

    Args:
        algorithm: the algorithm to gate.
        n: the period in steps (``state.time.step``), ``>= 1``.
        offset: the first active step, ``>= 0``.

    Returns:
        An :class:`Algorithm` with ``algorithm``'s name, state and flags.

    Raises:
        TypeError: if ``algorithm`` is not an ``Algorithm``, or ``n``/``offset`` is not an
            int.
        ValueError: if ``n < 1`` or ``offset < 0``.

    Example:
        >>> from sbfunc.engine import Event, every_n_steps
        >>> from sbfunc.testing import Toy
        >>> alg = every_n_steps(Toy(), 3, offset=1)
        >>> ctx = sbfunc.Context(sbfunc.random.key(0))
        >>> [s for s in range(8)
        ...  if alg.match(Event.INIT, ctx.replace(time=sbfunc.Time(step=s)))]
        [1, 4, 7]

    References:
        optax ``MultiSteps``; PyTorch Lightning ``every_n_train_steps``.
    """
    _check_algorithm(algorithm, "algorithm")
    check_int(n, "n", low=1)
    check_int(offset, "offset", low=0)

    def gate(event: Event, ctx: Context) -> bool:
        step = ctx.time.step
        return step >= offset and (step - offset) % n == 0

    return _Gated(algorithm, gate, f"every_n_steps(n={n}, offset={offset})")


def when(algorithm: Algorithm, predicate: Callable[[Context], Any]) -> Algorithm:
    """Run ``algorithm`` only when ``predicate(ctx)`` is true.

    The predicate runs on the host with ``match`` (before the step's tensor work): decide from
    ``ctx.time`` and Python values, not from tensors.

    Args:
        algorithm: the algorithm to gate.
        predicate: a pure function of the :class:`Context` (called once per event, before
            ``match``).

    Returns:
        An :class:`Algorithm` with ``algorithm``'s name, state and flags.

    Raises:
        TypeError: if ``algorithm`` is not an ``Algorithm`` or ``predicate`` is not callable.

    Example:
        >>> from sbfunc.engine import Event, when
        >>> from sbfunc.testing import Toy
        >>> alg = when(Toy(), lambda s: s.time.epoch >= 2)
        >>> ctx = sbfunc.Context(sbfunc.random.key(0))
        >>> later = ctx.replace(time=sbfunc.Time(epoch=2))
        >>> alg.match(Event.INIT, ctx), alg.match(Event.INIT, later)
        (False, True)

    References:
        optax ``conditionally_transform``.
    """
    _check_algorithm(algorithm, "algorithm")
    if not callable(predicate):
        raise TypeError(f"predicate must be callable (ctx -> bool), got {predicate!r}")
    return _Gated(algorithm, lambda event, ctx: bool(predicate(ctx)), f"when({predicate!r})")
