"""The engine: decide (``match`` and passes, on the host), then apply (tensor work).

One event runs in two phases. :func:`plan_event` calls every algorithm's ``match`` once on the
host and orders the matched ones with the passes; it reads only host values, so a compiled step
computes it outside its graph. :func:`apply_planned` applies the planned algorithms in order to
a :class:`Run` (the step's carrier: the persistent fields, the batch's values and every
algorithm's state), focusing each one on its own state, scratch and key. :func:`run_event` does
both for events outside the training step (``INIT``, ``EPOCH_END``, ...).
"""

from __future__ import annotations

import copy
import operator
import zlib
from collections.abc import Sequence
from typing import Any, NamedTuple, cast

import torch

from sbfunc import random as sbrandom
from sbfunc.engine.algorithm import Algorithm
from sbfunc.engine.events import Event
from sbfunc.engine.ordering import DEFAULT_PASSES, Pass
from sbfunc.engine.state import Clock, State, Time, TrainState

__all__ = [
    "Planned",
    "Run",
    "Trace",
    "apply_planned",
    "plan_event",
    "run_event",
    "stream_ids",
    "trace_labels",
    "unpack_result",
]

_EVENT_INDEX = {e: i for i, e in enumerate(Event)}


class Trace(NamedTuple):
    """The record of one algorithm applied on one event.

    Attributes:
        name: the algorithm's name, made unique within its list (repeats become ``name#1``,
            ``name#2``, ... by position in the list).
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


Planned = tuple[tuple[int, Any], ...]
"""A planned event: ``(position in the algorithm list, match decision)`` in application order."""


class Run(NamedTuple):
    """The carrier of one step (or one event outside a step) through the engine.

    The persistent fields of :class:`TrainState` (``algorithm_state`` whole), the batch's
    values, every algorithm's scratch (a tuple like ``algorithm_state``), the traces so far and
    the step's base key (``None`` until an algorithm needs one).
    """

    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    opt_state: Any
    algorithm_state: tuple[Any, ...]
    key: torch.Tensor
    time: Time
    clock: Clock | None
    scratch: tuple[Any, ...]
    batch: Any = None
    outputs: Any = None
    loss: torch.Tensor | None = None
    losses: torch.Tensor | None = None
    grads: dict[str, torch.Tensor] | None = None
    sample_weights: torch.Tensor | None = None
    samples_scored: int = 0
    traces: tuple[Trace, ...] = ()
    step_key: torch.Tensor | None = None

    @staticmethod
    def start(state: TrainState, batch: Any, clock: Clock | None) -> Run:
        """A run at the start of a step on ``batch`` (every scratch ``None``)."""
        n = len(state.algorithm_state)
        return Run(
            state.params,
            state.buffers,
            state.opt_state,
            state.algorithm_state,
            state.key,
            state.time,
            clock,
            (None,) * n,
            batch,
        )

    def persistent(self, time: Time) -> TrainState:
        """The :class:`TrainState` this run leaves, with ``time``."""
        return TrainState(
            self.params, self.buffers, self.key, self.opt_state, self.algorithm_state, time
        )


def stream_ids(names: Sequence[str]) -> tuple[int, ...]:
    """The random-stream id of each algorithm from the list of their names: a hash of the name
    and the rank among the algorithms of that name, so adding, removing or moving another
    algorithm never changes an algorithm's draws.

    Example:
        >>> a, b, c = sbfunc.engine.stream_ids(["Toy", "x", "Toy"])
        >>> a != c, sbfunc.engine.stream_ids(["x"])[0] == b
        (True, True)

    References:
        JAX ``jax.random.fold_in`` (deriving independent streams from stable identifiers).
    """
    seen: dict[str, int] = {}
    out = []
    for name in names:
        rank = seen.get(name, 0)
        seen[name] = rank + 1
        out.append(zlib.crc32(name.encode()) | (rank << 32))
    return tuple(out)


def trace_labels(algorithms: Sequence[Algorithm]) -> tuple[str, ...]:
    """Each algorithm's label in traces: its name, repeats suffixed ``#1``, ``#2``, ...

    Example:
        >>> from sbfunc.testing import Toy
        >>> sbfunc.engine.trace_labels([Toy(), Toy(name="B"), Toy()])
        ('Toy', 'B', 'Toy#1')
    """
    seen: dict[str, int] = {}
    taken: set[str] = set()
    out = []
    for name in map(operator.attrgetter("name"), algorithms):
        label, k = name, seen.get(name, 0)
        while label in taken:
            k += 1
            label = f"{name}#{k}"
        seen[name] = k
        taken.add(label)
        out.append(label)
    return tuple(out)


def match_view(run: Run, index: int, time: Time) -> State:
    """The :class:`State` algorithm ``index`` sees in ``match`` (host values; the root key)."""
    return State(
        run.key,
        run.params,
        run.buffers,
        run.opt_state,
        time,
        run.clock,
        run.algorithm_state[index],
        run.scratch[index],
        True,
        run.batch,
        run.outputs,
        run.loss,
        run.losses,
        run.grads,
        run.sample_weights,
        run.samples_scored,
    )


def plan_event(
    event: Event,
    run: Run,
    algorithms: Sequence[Algorithm],
    passes: Sequence[Pass] = DEFAULT_PASSES,
    time: Time | None = None,
    views: Sequence[State] | None = None,
) -> Planned:
    """Decide which algorithms run on ``event`` and in which order (host only).

    ``match`` is called exactly once per algorithm, in list order, on views of ``run`` with
    ``time`` (default ``run.time``); the passes then order the matched algorithms (they are not
    called when nothing matched, and the default passes not when one did: they only reorder).
    A caller that plans several events of one run passes the views (``match_view`` of every
    algorithm at ``time``) once for all of them.

    Returns:
        ``((position, decision), ...)`` in application order.

    Raises:
        ValueError: if a pass returns an algorithm that did not match this event.
    """
    if views is None:
        t = run.time if time is None else time
        views = [match_view(run, i, t) for i in range(len(algorithms))]
    decisions = [alg.match(event, v) for alg, v in zip(algorithms, views, strict=True)]
    matched = [i for i, d in enumerate(decisions) if d]
    if len(matched) <= 1 and passes is DEFAULT_PASSES:
        return tuple((i, decisions[i]) for i in matched)
    if not matched:
        return ()
    # Passes see objects; an object listed twice gets a shallow copy per extra occurrence,
    # so every matched position is a distinct object a pass can move on its own.
    seen: set[int] = set()
    ordered: list[Algorithm] = []
    for i in matched:
        alg = algorithms[i]
        ordered.append(copy.copy(alg) if id(alg) in seen else alg)
        seen.add(id(alg))
    position: dict[int, int] = {id(alg): i for alg, i in zip(ordered, matched, strict=True)}
    for p in passes:
        ordered = p(ordered, event)
    out = []
    for alg in ordered:
        i = position.pop(id(alg), -1)
        if i < 0:
            raise ValueError(
                f"a pass returned {alg!r} on {event.name}, which is not one of the algorithms "
                "that matched it, or returned it twice (passes may only reorder)"
            )
        out.append((i, decisions[i]))
    return tuple(out)


def _set(values: tuple[Any, ...], index: int, value: Any) -> tuple[Any, ...]:
    return (*values[:index], value, *values[index + 1 :])


def _key_for(run: Run, stream: int, event: Event) -> tuple[Run, torch.Tensor]:
    step_key = run.step_key
    if step_key is None:
        if run.clock is None:
            raise RuntimeError("the engine needs the clock to derive keys")  # pragma: no cover
        step_key = sbrandom.fold_in(run.key, run.clock.step)
        run = run._replace(step_key=step_key)
    data = (stream << 8) | _EVENT_INDEX[event]  # < 2**48: no mask, no huge constants
    return run, sbrandom.fold_in(step_key, data)


def apply_planned(
    event: Event,
    planned: Planned,
    run: Run,
    algorithms: Sequence[Algorithm],
    labels: Sequence[str],
    streams: Sequence[int],
) -> Run:
    """Apply the planned algorithms of ``event`` to ``run`` in order (tensor work).

    Each algorithm gets a :class:`State` focused on it (its ``own``, ``scratch``, ``matched``
    decision and its key, derived from the root key, the step, its stream id and the event,
    or ``None`` when it declares ``uses_key = False``);
    what it returns flows back into the run, and a :class:`Trace` is appended.

    Raises:
        TypeError: if an ``apply`` returns neither a ``State`` nor ``(State, exit_code)``.
    """
    for order, (i, decision) in enumerate(planned):
        key = cast(torch.Tensor, None)  # an algorithm that draws nothing gets no key
        if algorithms[i].uses_key:
            run, key = _key_for(run, streams[i], event)
        view = State(
            key,
            run.params,
            run.buffers,
            run.opt_state,
            run.time,
            run.clock,
            run.algorithm_state[i],
            run.scratch[i],
            decision,
            run.batch,
            run.outputs,
            run.loss,
            run.losses,
            run.grads,
            run.sample_weights,
            run.samples_scored,
        )
        out, code = unpack_result(algorithms[i].apply(event, view), algorithms[i])
        run = run._replace(
            params=out.params,
            buffers=out.buffers,
            opt_state=out.opt_state,
            algorithm_state=_set(run.algorithm_state, i, out.own),
            scratch=_set(run.scratch, i, out.scratch),
            batch=out.batch,
            outputs=out.outputs,
            loss=out.loss,
            losses=out.losses,
            grads=out.grads,
            sample_weights=out.sample_weights,
            samples_scored=out.samples_scored,
            traces=(*run.traces, Trace(labels[i], event, order, code)),
        )
    return run


def unpack_result(result: object, alg: Algorithm) -> tuple[State, int | None]:
    """``(state, exit_code)`` from what an ``apply`` returned (raises ``TypeError`` otherwise)."""
    if isinstance(result, State):
        return result, None
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], State):
        return result[0], result[1]
    raise TypeError(
        f"{alg.name}.apply must return a State or a (State, exit_code) pair, "
        f"got {type(result).__name__}"
    )


def run_event(
    event: Event,
    state: TrainState,
    algorithms: Sequence[Algorithm],
    passes: Sequence[Pass] = DEFAULT_PASSES,
) -> tuple[TrainState, tuple[Trace, ...]]:
    """Run one event outside a training step: match, order, apply; return the new state.

    1. ``match(event, state)`` is called exactly once per algorithm, in list order.
    2. The passes order the matched algorithms (``pass(algorithms, event) -> list``).
    3. Each is applied in turn to what the previous one returned, focused on its own entry of
       ``state.algorithm_state`` and its own key.

    Args:
        event: the event.
        state: the train state; ``state.algorithm_state`` has one entry per algorithm.
        algorithms: the algorithms of the run.
        passes: the ordering passes (``sbfunc.passes.DEFAULT_PASSES`` by default).

    Returns:
        ``(new_state, traces)``, one :class:`Trace` per applied algorithm, in order.

    Raises:
        TypeError: if ``event`` is not an :class:`Event`.
        ValueError: if ``state.algorithm_state`` does not have one entry per algorithm.

    Example:
        >>> from sbfunc.engine import Event, TrainState, run_event
        >>> from sbfunc.testing import Toy
        >>> algs = [Toy(tag=1), Toy(tag=2)]
        >>> state = TrainState({}, {}, sbfunc.random.key(0), algorithm_state=((), ()))
        >>> state, traces = run_event(Event.AFTER_LOSS, state, algs)  # FILO: reversed
        >>> [(t.name, t.order) for t in traces]
        [('Toy#1', 0), ('Toy', 1)]

    References:
        MosaicML Composer ``Engine.run_event``.
    """
    if type(event) is not Event:
        raise TypeError(f"event must be an sbfunc Event, got {event!r}")
    if len(state.algorithm_state) != len(algorithms):
        raise ValueError(
            f"state.algorithm_state has {len(state.algorithm_state)} entries for "
            f"{len(algorithms)} algorithms; build the state with step.init(...) from the same "
            "algorithm list"
        )
    run = Run.start(state, None, None)
    planned = plan_event(event, run, algorithms, passes)
    if not planned:
        return state, ()
    run = run._replace(clock=Clock.of(state.time, state.key.device))
    run = apply_planned(
        event,
        planned,
        run,
        algorithms,
        trace_labels(algorithms),
        stream_ids([a.name for a in algorithms]),
    )
    return run.persistent(state.time), run.traces
