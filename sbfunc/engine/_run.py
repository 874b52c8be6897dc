"""Applying the planned algorithms: one context carried through a step, focused on each one.

:class:`Carry` is everything a step (or one event outside a step) carries through the engine:
the one :class:`~sbfunc.Context` context, every algorithm's persistent state (the tuple that
mirrors the algorithm list), every leaf's per-batch scratch, the traces so far and the step's
base key. :func:`apply_planned` applies one event's planned leaves in order: it focuses the
context on each (its ``own``, ``scratch``, ``matched`` decision and key: four fields), and
what the algorithm returns *is* the next context. :func:`run_event` plans and applies one
event outside a training step (``INIT``, ``EPOCH_END``, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, cast

import torch

from sbfunc import random as sbrandom
from sbfunc._tracing import replace_by_constructor
from sbfunc.engine._algorithm import Algorithm
from sbfunc.engine._events import Event
from sbfunc.engine._ordering import DEFAULT_PASSES, Pass
from sbfunc.engine._plan import Leaf, Planned, Planner, get_path, set_path
from sbfunc.engine._state import Context, TrainState
from sbfunc.engine._trace import Trace, unpack_result
from sbfunc.engine._writes import OUTSIDE_STEP, Writable, check_writes

__all__ = ["Carry", "advance_time", "apply_planned", "leaf_key", "run_event", "step_key"]

_EVENT_INDEX = {e: i for i, e in enumerate(Event)}


@replace_by_constructor
class Carry(NamedTuple):
    """What the engine carries through a step: the context and the algorithms' states.

    Attributes:
        context: the :class:`~sbfunc.Context` every algorithm sees (focused on each in turn).
        algorithm_state: ``TrainState.algorithm_state`` as updated so far.
        scratch: one per-batch scratch per leaf (``None`` at the start of a step).
        traces: the traces so far.
        step_key: the step's base key (the root key folded with the step), or ``None`` until
            an algorithm needs a key.
    """

    context: Context
    algorithm_state: Any
    scratch: tuple[Any, ...]
    traces: tuple[Trace, ...] = ()
    step_key: torch.Tensor | None = None

    @staticmethod
    def start(state: TrainState, context: Context, leaves: int) -> Carry:
        """The carry at the start of a step (or event) on ``context``."""
        return Carry(context, state.algorithm_state, (None,) * leaves)

    def outliving(self) -> Carry:
        """This carry with only what outlives the step: the context's persistent fields
        (parameters, buffers, optimizer state), its two step counts (``samples_scored``,
        ``rows_unscorable``) and the selection it made (``kept``), the algorithms' states and
        the traces. The per-batch values
        (batch, outputs, losses, gradients, scratches, keys, the time tensors) are dropped, so
        a compiled step neither returns nor materialises them."""
        c = self.context
        kept = Context(
            cast(torch.Tensor, None),
            c.params,
            c.buffers,
            c.opt_state,
            samples_scored=c.samples_scored,
            rows_unscorable=c.rows_unscorable,
            kept=c.kept,
        )
        return Carry(kept, self.algorithm_state, (None,) * len(self.scratch), self.traces)


def step_key(root: torch.Tensor, step: torch.Tensor | int) -> torch.Tensor:
    """The base key of one step: the root key folded with the step count."""
    return sbrandom.fold_in(root, step)


def leaf_key(base: torch.Tensor, leaf: Leaf, event: Event) -> torch.Tensor:
    """A leaf's key for one step and event: ``base`` folded with its first stream id and the
    event, then with the stream id of each sequence part on its path."""
    key = sbrandom.fold_in(base, (leaf.streams[0] << 8) | _EVENT_INDEX[event])
    for stream in leaf.streams[1:]:
        key = sbrandom.fold_in(key, stream)
    return key


def apply_planned(
    event: Event,
    planned: Planned,
    carry: Carry,
    leaves: Sequence[Leaf],
    root: torch.Tensor,
    *,
    writes: Writable | None = None,
) -> Carry:
    """Apply the planned leaves of ``event`` to ``carry``, in order (tensor work).

    Each leaf sees the context focused on it: its own state, its scratch, its ``match``
    decision and its key (derived from ``root``, the step, its stream ids and the event, or
    ``None`` when it declares ``uses_key = False``). What it returns is the next context; its
    ``own`` and ``scratch`` go back to their slots, and a :class:`Trace` is appended.

    Args:
        writes: the fields an algorithm may change on ``event``
            (:mod:`sbfunc.engine`); ``None``: no check.

    Raises:
        TypeError: if an ``apply`` returns neither a ``Context`` nor ``(Context, exit_code)``.
        ValueError: if an ``apply`` changes a field that ``writes`` says nothing reads.
    """
    context, states, scratch, traces, base = carry
    scratch_list = list(scratch)
    for order, (i, decision) in enumerate(planned):
        leaf = leaves[i]
        alg = leaf.algorithm
        key = cast(torch.Tensor, None)  # an algorithm that draws nothing gets no key
        if alg.uses_key:
            if base is None:
                base = step_key(root, context.time.step)
            key = leaf_key(base, leaf, event)
        view = context._replace(
            key=key, own=get_path(states, leaf.path), scratch=scratch_list[i], matched=decision
        )
        context, code = unpack_result(alg.apply(event, view), alg)
        if writes is not None:
            check_writes(event, view, context, leaf.label, writes)
        states = set_path(states, leaf.path, context.own)
        scratch_list[i] = context.scratch
        traces = (*traces, Trace(leaf.label, event, order, code))
    return Carry(context, states, tuple(scratch_list), traces, base)


def run_event(
    event: Event,
    state: TrainState,
    algorithms: Sequence[Algorithm],
    passes: Sequence[Pass] = DEFAULT_PASSES,
    *,
    planner: Planner | None = None,
) -> tuple[TrainState, tuple[Trace, ...]]:
    """Run one event outside a training step: match, order, apply; return the new state.

    1. ``match(event, view)`` is called exactly once per algorithm (sequences: per part), in list
       order, on a view holding the time and the algorithm's own state.
    2. The matched algorithms are applied in the order the passes give the algorithm list.
    3. Each is applied in turn to what the previous one returned, focused on its own entry of
       ``state.algorithm_state`` and its own key; ``apply`` sees the time as tensors.

    Args:
        event: the event.
        state: the train state; ``state.algorithm_state`` has one entry per algorithm.
        algorithms: the algorithms of the run.
        passes: the ordering passes (``sbfunc.engine.DEFAULT_PASSES`` by default).
        planner: a :class:`~sbfunc.engine.internal.Planner` of ``algorithms`` that plans ``event``
            (a training step passes its own); ``None`` builds one.

    Returns:
        ``(new_state, traces)``, one :class:`Trace` per applied algorithm, in order.

    Raises:
        TypeError: if ``event`` is not an :class:`Event`.
        ValueError: if ``state.algorithm_state`` does not have one entry per algorithm, or an
            algorithm changes a field that is not kept outside a step (``batch``, ``loss``,
            ...: :mod:`sbfunc.engine`).

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
    if planner is None or event not in planner.events:
        planner = Planner(algorithms, passes, (event,))
    planned = planner.decide_event(event, state.time, state.algorithm_state)
    if not planned:
        return state, ()
    context = Context(
        None,  # type: ignore[arg-type]
        state.params,
        state.buffers,
        state.opt_state,
        state.time.as_tensors(state.key.device),
    )
    carry = Carry.start(state, context, len(planner.leaves))
    carry = apply_planned(event, planned, carry, planner.leaves, state.key, writes=OUTSIDE_STEP)
    out = carry.context
    new = TrainState(
        out.params, out.buffers, state.key, out.opt_state, carry.algorithm_state, state.time
    )
    return new, carry.traces


def advance_time(carry: Carry) -> Carry:
    """The carry after the update: its (tensor) time shows the next step, as
    :meth:`sbfunc.Time.advanced` does on the host (``elapsed`` from ``total_steps`` once it is
    known)."""
    context = carry.context
    t = context.time
    if t is None:
        return carry
    step = t.step + 1
    elapsed = t.elapsed
    if t.total_steps is not None:  # as Time.advanced does on the host
        elapsed = (step / t.total_steps).clamp(max=1.0).to(t.elapsed.dtype)
    t = t._replace(step=step, batch_in_epoch=t.batch_in_epoch + 1, elapsed=elapsed)
    return carry._replace(context=context._replace(time=t))
