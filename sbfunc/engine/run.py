"""The engine: ``run_event`` matches, orders (passes) and applies algorithms on one event."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import NamedTuple

from sbfunc.engine.algorithm import Algorithm
from sbfunc.engine.combinators import unique_names
from sbfunc.engine.events import Event
from sbfunc.engine.ordering import DEFAULT_PASSES, Pass
from sbfunc.engine.state import State

__all__ = ["Trace", "run_event"]


class Trace(NamedTuple):
    """The record of one algorithm applied on one event.

    Attributes:
        name: the algorithm's name, made unique within the list passed to ``run_event``
            (repeats become ``name#1``, ``name#2``, ... by position in that list).
        event: the event.
        order: the position in the applied order (0 first).
        exit_code: what ``apply`` returned beside the state, or ``None``.

    Example:
        >>> from sbfunc.engine import Event, Trace
        >>> Trace("CutOut", Event.AFTER_DATALOADER, 0, None).order
        0

    References:
        MosaicML Composer ``composer.core.engine.Trace``.
    """

    name: str
    event: Event
    order: int
    exit_code: int | None = None


_new_trace = tuple.__new__


_name = operator.attrgetter("name")


def _labelled(algorithms: Sequence[Algorithm], ordered: list[Algorithm]) -> list[str]:
    """The unique label of each algorithm of ``ordered``, by position in ``algorithms``."""
    names = list(map(_name, algorithms))
    if len(set(names)) == len(names):
        return list(map(_name, ordered))
    labels = unique_names(names)
    # Repeated names (maybe the same object twice): each object takes the labels of its
    # positions in ``algorithms`` in turn; an object a pass added keeps its name.
    positions: dict[int, list[str]] = {}
    for alg, label in zip(algorithms, labels, strict=True):
        positions.setdefault(id(alg), []).append(label)
    out = []
    for alg in ordered:
        queue = positions.get(id(alg))
        out.append(queue.pop(0) if queue else alg.name)
    return out


def run_event(
    event: Event,
    state: State,
    algorithms: Sequence[Algorithm],
    passes: Sequence[Pass] = DEFAULT_PASSES,
) -> tuple[State, tuple[Trace, ...]]:
    """Run one event: match every algorithm once, order the matched ones, apply them in turn.

    1. ``match(event, state)`` is called exactly once per algorithm, in list order, on the
       state the event started with.
    2. The passes run in order on the matched list (``pass(algorithms, event) -> list``);
       when nothing matched there is nothing to order, and they are not called.
    3. Each algorithm of the resulting list is applied to the state the previous one
       returned. ``apply`` returns a ``State``, or ``(state, exit_code)``.

    Args:
        event: the event.
        state: the state at the event.
        algorithms: every algorithm of the run (the engine filters by ``match``).
        passes: the ordering passes (``sbfunc.passes.DEFAULT_PASSES`` by default).

    Returns:
        ``(new_state, traces)``: one :class:`Trace` per applied algorithm, in application
        order. ``state`` itself is never modified.

    Raises:
        TypeError: if ``event`` is not an :class:`Event`, or an ``apply`` returns neither a
            ``State`` nor a ``(State, exit_code)`` pair (the message names the algorithm).

    Example:
        >>> from sbfunc.engine import Event, init_state, run_event
        >>> from sbfunc.testing import Toy
        >>> algs = [Toy(tag=1), Toy(tag=2)]
        >>> state = init_state({}, {}, key=sbfunc.random.key(0))
        >>> state, traces = run_event(Event.AFTER_LOSS, state, algs)  # FILO: reversed
        >>> state.algorithm_state["log"], [t.name for t in traces]
        ((2, 1), ['Toy#1', 'Toy'])

    References:
        MosaicML Composer ``Engine.run_event``.
    """
    if type(event) is not Event:
        raise TypeError(f"event must be an sbfunc Event, got {event!r}")
    matched = [alg for alg in algorithms if alg.match(event, state)]
    if not matched:  # nothing to order or apply: the passes only see matched algorithms
        return state, ()
    ordered = matched
    if len(matched) > 1 or passes is not DEFAULT_PASSES:  # the defaults only reorder
        for p in passes:
            ordered = p(ordered, event)
    labels = _labelled(algorithms, ordered)
    traces = []
    for order, alg in enumerate(ordered):
        result = alg.apply(event, state)
        if type(result) is State:
            code = None
            state = result
        else:
            state, code = _unpack(result, alg)
        traces.append(_new_trace(Trace, (labels[order], event, order, code)))
    return state, tuple(traces)


def _unpack(result: object, alg: Algorithm) -> tuple[State, int | None]:
    if isinstance(result, State):  # a subclass of State
        return result, None
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], State):
        return result[0], result[1]
    raise TypeError(
        f"{alg.name}.apply must return a State or a (State, exit_code) pair, "
        f"got {type(result).__name__}"
    )
