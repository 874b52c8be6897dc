"""The training step: ``step(state, batch) -> (state, metrics)``, a pure function.

Same ``state`` and ``batch``, same result: every random draw derives from ``state.key``, and
nothing outside the arguments changes (the input state is not modified). One call fires the 11
per-batch events (:data:`~sbfunc.step.BATCH_EVENTS`) in Composer's order around the
forward, the gradients and the update. It runs in three parts, each callable on its own:
:meth:`TrainStep.plan` decides on the host which algorithms run on each event (``match`` from
``state.time``; plans are cached by their decisions); :meth:`TrainStep.core` does all the
tensor work and reads no Python number that changes from step to step; :meth:`TrainStep.finish`
advances the host :class:`~sbfunc.Time` and builds the :class:`StepMetrics`.

:meth:`TrainStep.core` reads top to bottom: the events before the forward (selection among
them), the corrupt-row mask, forward and gradients (microbatched:
:mod:`sbfunc.step`), the replicas' mean (:mod:`sbfunc.step`),
``AFTER_BACKWARD``, the gradient transform and its update, the non-finite keep
(:mod:`sbfunc.step`), the events after. How it compiles is :mod:`sbfunc.step`;
the walk-through is ``docs/concepts/step.md``.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch

from sbfunc import random as sbrandom
from sbfunc._tracing import host_readable
from sbfunc.batch import batch_size
from sbfunc.engine import Algorithm, Context, Event, Pass, Time, Trace, TrainState, run_event
from sbfunc.engine.internal import (
    Carry,
    Planner,
    advance_time,
    apply_planned,
    in_step,
    step_key,
    stream_ids,
)
from sbfunc.module import ModuleLoss
from sbfunc.optim import (
    GradientTransformation,
    apply_updates,
    loss_scale,
    scales_loss,
    takes_items,
    unscale,
)
from sbfunc.random import check_key
from sbfunc.step._compile import CompilableStep
from sbfunc.step._guard import NonFinite, NonFiniteGuard, opt_state_on_skip
from sbfunc.step._means import ObjectiveKind
from sbfunc.step._microbatch import Microbatching, accumulate
from sbfunc.step._objective import AUTOCAST, INSIDE_EVENTS, Fire, Objective, Precision
from sbfunc.step._records import (
    BATCH_EVENTS,
    Clock,
    CoreOutputs,
    Gradients,
    StepMetrics,
    StepPlan,
)
from sbfunc.step._replicas import ONE_PROCESS, Replicas, no_rows_here
from sbfunc.types import LossFn, Params, PerSample
from sbfunc.validation import check_int

__all__ = ["BATCH_EVENTS", "NonFinite", "StepMetrics", "StepPlan", "TrainStep"]


_MODEL_STREAM = zlib.crc32(b"sbfunc.model") | (1 << 40)  # never an algorithm's stream id
_INIT_STREAM = zlib.crc32(b"sbfunc.init") | (1 << 41)
_BEFORE_FORWARD = BATCH_EVENTS[:4]  # AFTER_DATALOADER ... BEFORE_FORWARD
_LOSS_EVENTS = (Event.AFTER_LOSS, Event.BEFORE_BACKWARD)


class TrainStep(CompilableStep):
    """``step(state, batch) -> (state, metrics)``; build it with :func:`make_train_step`.

    An ``nn.Module`` (through :class:`~sbfunc.step._compile.CompilableStep`, which says why)
    with no parameters of its own; ``step.compile()`` compiles it in place.

    Example:
        >>> ce = torch.nn.functional.cross_entropy
        >>> loss_fn = sbfunc.per_sample_loss(torch.nn.Linear(2, 2), ce)
        >>> step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1))
        >>> state = step.init(*sbfunc.split_module(loss_fn.module), key=sbfunc.random.key(0))
        >>> step.run_event(sbfunc.Event.EPOCH_END, state) == (state, ())  # no algorithm matches
        True

    References:
        MosaicML Composer ``Engine`` and ``Trainer``; ``jax.jit(train_step)``.
    """

    def __init__(
        self,
        loss_fn: LossFn,
        optimizer: GradientTransformation,
        algorithms: Sequence[Algorithm],
        passes: Sequence[Pass],
        nonfinite: NonFinite,
        keyed_model: bool,
        microbatching: Microbatching | None = None,
        *,
        per_sample: PerSample = None,
        replicas: Replicas = ONE_PROCESS,
        precision: Precision = "fp32",
        objective: ObjectiveKind = "tokens",
    ) -> None:
        super().__init__()
        self.precision = precision
        self.scales_loss = scales_loss(optimizer)  # dynamic_loss_scale: scale the loss
        self.takes_items = takes_items(optimizer)  # multi_steps(by_items=True): pass them
        self.replicas = replicas
        self.microbatching = microbatching
        self.per_sample = per_sample
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.algorithms = tuple(algorithms)
        self.passes = tuple(passes)
        self.nonfinite = nonfinite
        usable = loss_fn.usable_rows if isinstance(loss_fn, ModuleLoss) else None
        self.guard = NonFiniteGuard(nonfinite, per_sample, usable)
        # frozen parameters given in buffers: never written by a forward, so never copied,
        # synchronised or guarded (a frozen base can be most of the model)
        self.constants = loss_fn.parameter_names() if isinstance(loss_fn, ModuleLoss) else None
        self.keyed_model = keyed_model
        self.planner = Planner(self.algorithms, self.passes, BATCH_EVENTS)
        self.all_events = Planner(self.algorithms, self.passes, tuple(Event))
        self.leaves = self.planner.leaves
        self.objective = Objective(
            loss_fn, per_sample, nonfinite != "allow", AUTOCAST[precision], objective,
            self.constants or frozenset(),
        )  # fmt: skip
        self.writes = in_step(staged=isinstance(loss_fn, ModuleLoss))
        self.uses_elapsed = [leaf.label for leaf in self.leaves if leaf.algorithm.uses_elapsed]

    def init(
        self, params: Params, buffers: Params, *, key: torch.Tensor, total_steps: int | None = None
    ) -> TrainState:
        """The initial :class:`~sbfunc.TrainState`: the gradient transform's and every
        algorithm's initial state, time zero; then ``INIT`` fires.

        Args:
            params: trainable tensors by name (copied into a new dict).
            buffers: non-trainable tensors by name (copied into a new dict).
            key: the run's root :mod:`sbfunc.random` key; every random draw derives from it.
            total_steps: the run's length in steps, so ``time.elapsed`` advances in a
                hand-written loop (:func:`sbfunc.fit` sets it itself); ``None``: unknown.

        Raises:
            TypeError: if ``key`` is not a key or ``params``/``buffers`` are not dicts of
                tensors.
            ValueError: if ``total_steps`` is not a positive int, or ``params``/``buffers`` do
                not match the module behind ``loss_fn`` (``sbfunc.module.check_state``).
        """
        from sbfunc.module import check_state

        check_key(key, "key")
        check_state(self.loss_fn, params, buffers, training=True)  # names, shapes, frozen
        if total_steps is not None:
            total_steps = check_int(total_steps, "total_steps", low=1)
        params, buffers, key = self.replicas.share(params, buffers, key)
        init_key = sbrandom.fold_in(key, _INIT_STREAM)
        streams = stream_ids([a.name for a in self.algorithms])
        zero = torch.zeros((), dtype=torch.int64, device=key.device)
        state = TrainState(
            params=dict(params),
            buffers=dict(buffers),
            key=key,
            opt_state=self.optimizer.init(dict(params)),
            algorithm_state=tuple(
                alg.init(sbrandom.fold_in(init_key, s))
                for alg, s in zip(self.algorithms, streams, strict=True)
            ),
            # two tensors, never one object twice (a compiled step would guard on the alias)
            time=Time(updates_skipped=zero, total_steps=total_steps, rows_nonfinite=zero.clone()),
        )
        return self.run_event(Event.INIT, state)[0]

    def run_event(self, event: Event, state: TrainState) -> tuple[TrainState, tuple[Trace, ...]]:
        """Run one event outside the step (``INIT``, ``EPOCH_END``, ...) with this step's
        algorithms and order (see :func:`sbfunc.engine.run_event`)."""
        return run_event(event, state, self.algorithms, self.passes, planner=self.all_events)

    def plan(self, state: TrainState, batch: Any) -> StepPlan:
        """Decide every per-batch event on the host (``match`` from ``state.time``; events
        after the update see ``step`` and ``batch_in_epoch`` advanced) and make the time
        tensors. Excluded from compilation."""
        if not isinstance(state, TrainState):
            raise TypeError(
                f"state must be an sbfunc.TrainState (from step.init), got {type(state).__name__}"
            )
        if len(state.algorithm_state) != len(self.algorithms):
            raise ValueError(
                f"state.algorithm_state has {len(state.algorithm_state)} entries for this "
                f"step's {len(self.algorithms)} algorithms; build the state with step.init"
            )
        time = state.time
        if self.uses_elapsed and time.total_steps is None:
            raise ValueError(
                f"{', '.join(self.uses_elapsed)} decide from time.elapsed (the fraction of "
                "training done), which needs the run's length: build the state with "
                "step.init(..., total_steps=N), or train with sbfunc.fit, which sets it"
            )
        device = state.key.device
        if not self.leaves:
            return StepPlan(
                self.planner.empty, Clock.of(time, device) if self.keyed_model else None
            )
        after = time.advanced(forwarded=0, backpropagated=0)  # the counters after the update
        events = self.planner.decide(time, state.algorithm_state, after)
        need_time = self.keyed_model or bool(events)
        return StepPlan(events, Clock.of(time, device) if need_time else None)

    def core(self, plan: StepPlan, state: TrainState, batch: Any) -> tuple[Carry, CoreOutputs]:
        """The tensor work of one step under ``plan``: the carry (the new persistent values)
        and the outputs. Compiles with ``fullgraph=True`` for fixed-size selections."""
        fire = self._firing(plan, state.key)
        carry = self._start(plan, state, batch)
        n_in = batch_size(batch, per_sample=self.per_sample)
        for event in _BEFORE_FORWARD:  # selection (Selective Backprop) happens here
            carry = fire(event, carry)
        skipped = state.time.updates_skipped
        if skipped is None:  # a hand-made Time: none skipped so far
            skipped = torch.zeros((), dtype=torch.int64, device=state.key.device)
        n_kept = batch_size(carry.context.batch, per_sample=self.per_sample)
        if n_kept == 0 and not self.replicas.collective:  # no row on any process
            return self._no_update(carry, fire, n_in, skipped, state.time)
        if n_kept == 0:  # no row here, the other processes have some: contribute nothing
            g = no_rows_here(carry, state.key.device)
        else:
            carry, ok = self.guard.mask(carry)  # a corrupt row costs one row
            g = self._gradients(plan, carry, fire, ok, state.key)
        carry, grads, loss, used, n_bwd, tokens = g
        grads, loss, apply = self.replicas.mean(grads, loss, n_bwd)
        buffers = carry.context.buffers
        buffers = _merged(buffers, self.replicas.sync_buffers(self._mutable(buffers)))
        context = carry.context._replace(grads=grads, buffers=buffers)
        carry = fire(Event.AFTER_BACKWARD, carry._replace(context=context))
        context = carry.context
        grads = grads if context.grads is None else context.grads
        items = {} if not self.takes_items else {"items": _items(tokens, used, n_bwd)}
        updates, opt_state = self.optimizer.update(
            grads, context.opt_state, context.params, **items
        )
        new = (apply_updates(context.params, updates), opt_state, self._mutable(context.buffers))
        old = (
            context.params,
            opt_state_on_skip(opt_state, context.opt_state),
            self._mutable(state.buffers),
        )
        finite, (params, opt_state, buffers) = self.guard.keep(loss, grads, apply, new, old)
        buffers = _merged(context.buffers, buffers)
        context = context._replace(params=params, opt_state=opt_state, buffers=buffers)
        carry = advance_time(carry._replace(context=context))
        carry = fire(Event.BATCH_END, fire(Event.AFTER_TRAIN_BATCH, carry))
        bad = self._rows_left_out(carry, used, skipped, state.time)
        unused = None if used is None else (~used).sum()
        out = CoreOutputs(loss, n_in, n_bwd, ~finite, skipped + (~finite).long(), *bad)
        return carry, out._replace(rows_unused=unused, tokens=tokens)

    def _mutable(self, buffers: Params) -> Params:
        """The buffers a forward may write (every one but the frozen parameters)."""
        if not self.constants:
            return buffers
        return {k: v for k, v in buffers.items() if k not in self.constants}

    def _firing(
        self, plan: StepPlan, root: torch.Tensor, only: Callable[[int], bool] | None = None
    ) -> Fire:
        """``fire(event, carry)``: apply the algorithms ``plan`` has for ``event`` (those
        whose leaf index ``only`` accepts, when given)."""
        planner, events, leaves, writes = self.planner, plan.events, self.leaves, self.writes

        def fire(event: Event, carry: Carry) -> Carry:
            planned = planner.planned(events, event)
            if only is not None:
                planned = tuple(p for p in planned if only(p[0]))
            if not planned:
                return carry
            return apply_planned(event, planned, carry, leaves, root, writes=writes)

        return fire

    def _token_selections(self, plan: StepPlan, root: torch.Tensor) -> tuple[Fire, Fire] | None:
        """With microbatches and a token selection planned on the loss events: ``(fire without
        the selections, fire with them alone)`` (:func:`~sbfunc.step._microbatch.accumulate`
        fires them once on the whole batch); ``None`` otherwise."""
        if self.microbatching is None:
            return None
        selects = {
            i
            for e in _LOSS_EVENTS
            for i, _ in self.planner.planned(plan.events, e)
            if self.leaves[i].algorithm.selects_tokens
        }
        if not selects:
            return None
        rest = self._firing(plan, root, lambda i: i not in selects)
        return rest, self._firing(plan, root, selects.__contains__)

    def _start(self, plan: StepPlan, state: TrainState, batch: Any) -> Carry:
        """The carry before the first event: no key until an algorithm is focused, no time
        when nothing reads it; every key of the step derives from the step-start time."""
        time = None if plan.clock is None else plan.clock.time(state.time)
        context = Context(
            cast(torch.Tensor, None),
            state.params,
            state.buffers,
            state.opt_state,
            cast(Time, time),
            batch=batch,
        )
        base = None if time is None else step_key(state.key, time.step)
        return Carry(context, state.algorithm_state, (None,) * len(self.leaves), (), base)

    def _gradients(
        self,
        plan: StepPlan,
        carry: Carry,
        fire: Fire,
        ok: torch.Tensor | None,
        root: torch.Tensor,
    ) -> Gradients:
        """Forward, loss and gradients of the kept rows, chunk by chunk with microbatching
        (:func:`~sbfunc.step._microbatch.accumulate`); with a loss scale, the gradients of the
        scaled loss, divided by the scale."""
        inside = any(self.planner.planned(plan.events, e) for e in INSIDE_EVENTS)
        scale = loss_scale(carry.context.opt_state) if self.scales_loss else None
        g = accumulate(
            self.objective,
            fire,
            carry,
            self.microbatching,
            per_sample=self.per_sample,
            inside=inside,
            model_key=self._model_key if self.keyed_model else None,
            ok=ok,
            scale=scale,
            whole=self._token_selections(plan, root),
        )
        return g if scale is None else g._replace(grads=unscale(g.grads, scale))

    def _no_update(
        self, carry: Carry, fire: Fire, n_in: int, skipped: torch.Tensor, time: Time
    ) -> tuple[Carry, CoreOutputs]:
        """No row left on any process: no update; the time advances, only ``BATCH_END``
        fires, and the step counts as skipped with a NaN loss."""
        carry = fire(Event.BATCH_END, advance_time(carry))
        nan = torch.full((), torch.nan, device=skipped.device)
        done = torch.ones((), dtype=torch.bool, device=skipped.device)
        bad = self._rows_left_out(carry, None, skipped, time)
        return carry, CoreOutputs(nan, n_in, 0, done, skipped + 1, *bad)

    def _rows_left_out(
        self, carry: Carry, used: torch.Tensor | None, like: torch.Tensor, time: Time
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """This step's left-out rows and the run's count after it (see ``NonFiniteGuard``)."""
        unscorable = carry.context.rows_unscorable
        return self.guard.count_rows(used, like, unscorable, time.rows_nonfinite)

    def _model_key(self, base: torch.Tensor) -> torch.Tensor:
        """The key the model's random operations (dropout) draw from in this step."""
        return self.replicas.model_key(sbrandom.fold_in(base, _MODEL_STREAM))

    def finish(
        self, state: TrainState, carry: Carry, out: CoreOutputs
    ) -> tuple[TrainState, StepMetrics]:
        """Advance the host clock and build the results. Excluded from ``torch.compile``;
        with ``nonfinite="raise"`` it reads the skip flag (a device sync)."""
        context = carry.context
        self.guard.check(out, state.time.step, self.replicas)
        rows = out.samples_backpropagated  # those that went through the backward
        trained = rows - _host_count(out.rows_unused)  # less the left-out ones, when free
        time = state.time.advanced(forwarded=rows + context.samples_scored, backpropagated=trained)
        time = time._replace(
            updates_skipped=out.updates_skipped, rows_nonfinite=out.rows_nonfinite_total
        )
        metrics = StepMetrics(
            out.loss,
            out.samples_in_batch,
            trained,
            out.skipped,
            carry.traces,
            out.rows_nonfinite,
            context.kept,
            out.tokens,
        )
        new = TrainState(
            context.params,
            context.buffers,
            state.key,
            context.opt_state,
            carry.algorithm_state,
            time,
        )
        return new, metrics


def _merged(buffers: Params, part: Params) -> Params:
    """``buffers`` with the entries of ``part`` (a subset of its names) replaced, in order."""
    if part is buffers or len(part) == len(buffers):
        return part
    return {k: part.get(k, v) for k, v in buffers.items()}


def _host_count(count: torch.Tensor | None) -> int:
    """A device count as a Python int where reading it costs no sync (on the CPU, outside a
    trace), else 0."""
    return 0 if count is None or not host_readable(count) else int(count)


def _items(tokens: torch.Tensor | None, used: torch.Tensor | None, rows: int) -> Any:
    """What the update averaged, for an optimizer that weighs gradients by it: the tokens of
    a loss over tokens, else the rows the loss used."""
    if tokens is not None:
        return tokens
    return rows if used is None else used.sum()
