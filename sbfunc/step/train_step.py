"""The pure training step: host decisions, then one traceable core, then the host clock.

``step(state, batch)`` runs in three parts. :meth:`TrainStep.plan` decides on the host which
algorithms run on each of the 11 per-batch events (``match`` and the passes, from
``state.time``) and makes the clock tensors. :meth:`TrainStep.core` does all the tensor work
(the algorithms' ``apply``, forward, loss, gradients, optimizer update, the non-finite guard)
and reads no Python number that changes from step to step, so ``torch.compile`` turns it into
one graph per plan (``fullgraph=True`` compiles it alone). :meth:`TrainStep.finish` advances
the host :class:`~sbfunc.Time`. ``plan`` and ``finish`` are excluded from compilation, so
``torch.compile(step)`` compiles the core and recompiles only when the plan changes (Selective
Backprop on or off): a fixed, small number of graphs over a whole run. Compiled, a text field
(a list of strings) reaches the core as row indices (:func:`sbfunc.batch.strings_as_row_indices`).
"""

from __future__ import annotations

import contextlib
import types
import zlib
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

import torch
from torch import nn

from sbfunc import random as sbrandom
from sbfunc.batch import PerSample, batch_size, strings_as_row_indices
from sbfunc.engine import (
    Algorithm,
    Clock,
    Event,
    Planned,
    Run,
    Time,
    Trace,
    TrainState,
    apply_planned,
    plan_event,
    run_event,
    stream_ids,
    trace_labels,
)
from sbfunc.engine.ordering import Pass
from sbfunc.engine.run import match_view
from sbfunc.module import LossFn, ModuleLoss, Params
from sbfunc.optim import Optimizer
from sbfunc.step.gradients import (
    all_finite,
    check_losses,
    detach_tensors,
    differentiate,
    fresh_buffers,
    keep_if_finite,
    tracing,
    weighted_mean,
)
from sbfunc.step.microbatch import Microbatching, accumulate

__all__ = ["BATCH_EVENTS", "NonFinite", "StepMetrics", "StepPlan", "TrainStep"]

BATCH_EVENTS: tuple[Event, ...] = (  # Composer's order; see its ``Event`` documentation
    Event.AFTER_DATALOADER,
    Event.BATCH_START,
    Event.BEFORE_TRAIN_BATCH,
    Event.BEFORE_FORWARD,
    Event.AFTER_FORWARD,
    Event.BEFORE_LOSS,
    Event.AFTER_LOSS,
    Event.BEFORE_BACKWARD,
    Event.AFTER_BACKWARD,
    Event.AFTER_TRAIN_BATCH,
    Event.BATCH_END,
)
"""The per-batch events, in Composer's order, that one training step fires."""

_INDEX = {e: i for i, e in enumerate(BATCH_EVENTS)}
_AFTER_UPDATE = frozenset({Event.AFTER_TRAIN_BATCH, Event.BATCH_END})
_MODEL_STREAM = zlib.crc32(b"sbfunc.model") | (1 << 40)  # never an algorithm's stream id
_INIT_STREAM = zlib.crc32(b"sbfunc.init") | (1 << 41)
NonFinite = Literal["skip", "raise", "allow"]
_untraced_strings = torch.compiler.disable(strings_as_row_indices)


class StepMetrics(NamedTuple):
    """What one step reports.

    Attributes:
        loss: the (weighted) mean training loss of the backpropagated rows, a 0-d tensor left
            on the device (reading it is the caller's choice of sync); NaN when no row was
            trained on.
        samples_in_batch: rows the data loader delivered.
        samples_backpropagated: rows the gradient was computed on (after selection).
        skipped: a 0-d bool tensor: the update did not reach the parameters (a non-finite
            loss or gradient, or no row left to train on).
        traces: the engine's traces of every event of the step, in order.

    Example:
        >>> m = sbfunc.StepMetrics(torch.tensor(0.5), 64, 32, torch.tensor(False), ())
        >>> m.samples_backpropagated / m.samples_in_batch
        0.5

    References:
        MosaicML Composer ``State`` (``batch``, ``loss``) and ``Trace``.
    """

    loss: torch.Tensor
    samples_in_batch: int
    samples_backpropagated: int
    skipped: torch.Tensor
    traces: tuple[Trace, ...]


class StepPlan(NamedTuple):
    """The host decisions of one step (see :meth:`TrainStep.plan`).

    Attributes:
        events: per event of :data:`BATCH_EVENTS`, the planned ``(position, decision)`` pairs.
        clock: the clock as tensors, or ``None`` when no algorithm and no model randomness
            needs it.
    """

    events: tuple[Planned, ...]
    clock: Clock | None


class _Out(NamedTuple):
    loss: torch.Tensor
    samples_in_batch: int
    samples_backpropagated: int
    skipped: torch.Tensor
    updates_skipped: torch.Tensor


class TrainStep(nn.Module):
    """``step(state, batch) -> (state, metrics)``; build it with :func:`make_train_step`.

    It is an ``nn.Module`` only so that ``torch.compile(step)`` returns a module that still has
    :meth:`init` and :meth:`fire` (compiled modules forward attribute access); it has no
    parameters of its own.

    Example:
        >>> ce = torch.nn.functional.cross_entropy
        >>> loss_fn = sbfunc.per_sample_loss(torch.nn.Linear(2, 2), ce)
        >>> step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1))
        >>> state = step.init({}, {}, key=sbfunc.random.key(0))
        >>> step.fire(sbfunc.Event.EPOCH_END, state) == (state, ())  # no algorithm matches
        True

    References:
        MosaicML Composer ``Engine`` and ``Trainer``; ``jax.jit(train_step)``.
    """

    def __init__(
        self,
        loss_fn: LossFn,
        optimizer: Optimizer,
        algorithms: Sequence[Algorithm],
        passes: Sequence[Pass],
        nonfinite: NonFinite,
        keyed_model: bool,
        microbatching: Microbatching | None = None,
        *,
        per_sample: PerSample = None,
    ) -> None:
        super().__init__()
        self.microbatching = microbatching
        self.per_sample = per_sample
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.algorithms = tuple(algorithms)
        self.passes = tuple(passes)
        self.nonfinite = nonfinite
        self.keyed_model = keyed_model
        self.labels = trace_labels(self.algorithms)
        self.streams = stream_ids([a.name for a in self.algorithms])
        # torch.compile caches graphs per code object: this step's own copies of the traced
        # methods keep several compiled steps in one process out of each other's cache entries
        # (otherwise every call checks the guards of every step's entries).
        for name in ("forward", "core"):
            fn = getattr(type(self), name)
            own = types.FunctionType(
                fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__
            )
            setattr(self, name, types.MethodType(own, self))

    def init(self, params: Params, buffers: Params, *, key: torch.Tensor) -> TrainState:
        """The initial :class:`~sbfunc.TrainState`: the optimizer's and every algorithm's
        initial state, time zero; then ``INIT`` fires.

        Args:
            params: trainable tensors by name (copied into a new dict).
            buffers: non-trainable tensors by name (copied into a new dict).
            key: the run's root :mod:`sbfunc.random` key; every random draw derives from it.

        Raises:
            TypeError: if ``key`` is not a key or ``params``/``buffers`` are not dicts of
                tensors.
        """
        sbrandom.check_key(key, "key")
        for arg, value in (("params", params), ("buffers", buffers)):
            if not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in value.items()
            ):
                raise TypeError(
                    f"{arg} must be a dict of name -> tensor (sbfunc.split_module), got "
                    f"{type(value).__name__}"
                )
        init_key = sbrandom.fold_in(key, _INIT_STREAM)
        state = TrainState(
            params=dict(params),
            buffers=dict(buffers),
            key=key,
            opt_state=self.optimizer.init(dict(params)),
            algorithm_state=tuple(
                alg.init(sbrandom.fold_in(init_key, s))
                for alg, s in zip(self.algorithms, self.streams, strict=True)
            ),
            time=Time(updates_skipped=torch.zeros((), dtype=torch.int64, device=key.device)),
        )
        return self.fire(Event.INIT, state)[0]

    def fire(self, event: Event, state: TrainState) -> tuple[TrainState, tuple[Trace, ...]]:
        """Run one event outside the step (``INIT``, ``EPOCH_END``, ...) with this step's
        algorithms and passes (see :func:`sbfunc.run_event`)."""
        return run_event(event, state, self.algorithms, self.passes)

    def forward(self, state: TrainState, batch: Any) -> tuple[TrainState, StepMetrics]:
        """One training step on ``batch``: ``plan``, ``core``, ``finish``."""
        if torch.compiler.is_compiling():  # host parts excluded from the graph
            batch = _untraced_strings(batch, per_sample=self.per_sample)  # no string guards
            plan = torch.compiler.disable(self.plan)(state, batch)
            run, out = self.core(plan, state, batch)
            return torch.compiler.disable(self.finish)(state, run, out)
        plan = self.plan(state, batch)  # eagerly: no compiler wrappers on the way
        run, out = self.core(plan, state, batch)
        return self.finish(state, run, out)

    def plan(self, state: TrainState, batch: Any) -> StepPlan:
        """Decide every per-batch event on the host (``match`` and passes, from
        ``state.time``; events after the update see ``step`` and ``batch_in_epoch`` advanced)
        and make the clock tensors. Excluded from ``torch.compile``."""
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
        if not self.algorithms:
            events: tuple[Planned, ...] = ((),) * len(BATCH_EVENTS)
        else:
            run = Run.start(state, batch, None)
            after = time._replace(step=time.step + 1, batch_in_epoch=time.batch_in_epoch + 1)
            n = range(len(self.algorithms))
            now, later = ([match_view(run, i, t) for i in n] for t in (time, after))
            algs, passes = self.algorithms, self.passes
            events = tuple(
                plan_event(e, run, algs, passes, views=later if e in _AFTER_UPDATE else now)
                for e in BATCH_EVENTS
            )
        need_clock = self.keyed_model or any(events)
        return StepPlan(events, Clock.of(time, state.key.device) if need_clock else None)

    def _fire(self, plan: StepPlan, event: Event, run: Run) -> Run:
        planned = plan.events[_INDEX[event]]
        if not planned:
            return run
        return apply_planned(event, planned, run, self.algorithms, self.labels, self.streams)

    def core(self, plan: StepPlan, state: TrainState, batch: Any) -> tuple[Run, _Out]:
        """The tensor work of one step under ``plan``; compiles with ``fullgraph=True`` for
        fixed-size selections. Returns the run (the new persistent values) and the outputs."""
        run = Run.start(state, batch, plan.clock)
        if plan.clock is not None:  # every key of the step derives from the step-start clock
            run = run._replace(step_key=sbrandom.fold_in(state.key, plan.clock.step))
        n_in = batch_size(batch, per_sample=self.per_sample)
        for event in BATCH_EVENTS[:4]:  # AFTER_DATALOADER ... BEFORE_FORWARD
            run = self._fire(plan, event, run)
        skipped_so_far = state.time.updates_skipped
        if skipped_so_far is None:
            skipped_so_far = torch.zeros((), dtype=torch.int64, device=state.key.device)
        n_kept = batch_size(run.batch, per_sample=self.per_sample)
        if n_kept == 0 and not self.data_parallel:  # every row left: no update
            if run.clock is not None:
                run = run._replace(clock=run.clock._replace(step=run.clock.step + 1))
            run = self._fire(plan, Event.BATCH_END, run)
            nan = torch.full((), torch.nan, device=skipped_so_far.device)
            done = torch.ones((), dtype=torch.bool, device=skipped_so_far.device)
            return run, _Out(nan, n_in, 0, done, skipped_so_far + 1)
        if self.microbatching is None:
            run, grads, loss = self._loss_and_grads(plan, run)
            n_bwd = batch_size(run.batch, per_sample=self.per_sample)
            run = self._fire(plan, Event.AFTER_LOSS, run)
            run = self._fire(plan, Event.BEFORE_BACKWARD, run)
        else:  # the kept rows in chunks, gradients accumulated (sbfunc.step.microbatch)
            run, grads, loss, n_bwd = accumulate(self, plan, run, self.microbatching)
        run, grads, loss, apply = self.synchronize(run, grads, loss, n_bwd)
        run = self._fire(plan, Event.AFTER_BACKWARD, run._replace(grads=grads))
        grads = grads if run.grads is None else run.grads
        params, opt_state = self.optimizer.update(grads, run.opt_state, run.params)
        checked = None if self.nonfinite == "allow" else all_finite(loss, grads)
        if apply is not None:
            checked = apply if checked is None else checked & apply
        if checked is None:
            finite = torch.ones((), dtype=torch.bool, device=loss.device)
        else:
            finite = checked
            if finite.device.type == "cpu" and not tracing():
                # Eagerly on the CPU the flag is a host value already (no device to sync):
                # branch instead of one torch.where per tensor.
                if not finite:
                    params, opt_state = run.params, run.opt_state
                    run = run._replace(buffers=state.buffers)
            else:
                params = keep_if_finite(finite, params, run.params)
                opt_state = keep_if_finite(finite, opt_state, run.opt_state)
                run = run._replace(buffers=keep_if_finite(finite, run.buffers, state.buffers))
        run = run._replace(params=params, opt_state=opt_state)
        if run.clock is not None:  # the update is done: the clock shows the next step
            run = run._replace(clock=run.clock._replace(step=run.clock.step + 1))
        run = self._fire(plan, Event.AFTER_TRAIN_BATCH, run)
        run = self._fire(plan, Event.BATCH_END, run)
        return run, _Out(loss, n_in, n_bwd, ~finite, skipped_so_far + (~finite).long())

    # Hooks for data parallelism (sbfunc.distributed.DataParallelStep overrides them).
    data_parallel: bool = False
    """Whether a batch left with zero rows still makes the step (another rank may have rows)."""

    def model_key(self, step_key: torch.Tensor) -> torch.Tensor:
        """The key the model's random operations (dropout) draw from in this step."""
        return sbrandom.fold_in(step_key, _MODEL_STREAM)

    def synchronize(
        self, run: Run, grads: Params, loss: torch.Tensor, rows: int
    ) -> tuple[Run, Params, torch.Tensor, torch.Tensor | None]:
        """Combine ``grads`` and ``loss`` (of this process's ``rows`` rows) with the other
        processes' before ``AFTER_BACKWARD``; the identity here. The last value, a 0-d bool
        tensor or ``None``, says whether to apply the update (``None``: decide as usual)."""
        return run, grads, loss, None

    def _loss_and_grads(self, plan: StepPlan, run: Run) -> tuple[Run, Params, torch.Tensor]:
        loss_fn = self.loss_fn
        staged = isinstance(loss_fn, ModuleLoss)
        buffers = run.buffers
        model_key = None
        if self.keyed_model:
            assert run.step_key is not None
            model_key = self.model_key(run.step_key)

        def randomness() -> contextlib.AbstractContextManager[Any]:
            return contextlib.nullcontext() if model_key is None else sbrandom.keyed(model_key)

        def objective(p: Params) -> tuple[torch.Tensor, tuple[Params, Run, torch.Tensor]]:
            b, r = fresh_buffers(buffers), run
            if isinstance(loss_fn, ModuleLoss):
                with randomness():
                    r = r._replace(outputs=loss_fn.forward(p, b, r.batch))
            r = self._fire(plan, Event.AFTER_FORWARD, r)
            r = self._fire(plan, Event.BEFORE_LOSS, r)
            if isinstance(loss_fn, ModuleLoss):
                losses = loss_fn.criterion(r.outputs, r.batch)
            else:
                with randomness():
                    losses = loss_fn(p, b, r.batch)
            check_losses(losses, batch_size(r.batch, per_sample=self.per_sample))
            # The host clock stays out of the aux: its Python numbers would become constants
            # of a compiled graph (and recompile it every step).
            return weighted_mean(losses, r.sample_weights), (b, r._replace(time=Time()), losses)

        time = run.time
        inside = plan.events[_INDEX[Event.AFTER_FORWARD]] or plan.events[_INDEX[Event.BEFORE_LOSS]]
        grads, loss, (new_buffers, run, losses) = differentiate(
            objective, run.params, detach_aux=False
        )
        # Eagerly the aux may carry autograd history: the outputs always, anything else only
        # when algorithms ran inside the objective (buffers update under no_grad).
        run = detach_tensors(run) if inside else run._replace(outputs=detach_tensors(run.outputs))
        run = run._replace(buffers=new_buffers, loss=loss, losses=losses.detach(), time=time)
        if not staged:
            run = run._replace(outputs=None)
        return run, grads, loss

    def finish(self, state: TrainState, run: Run, out: _Out) -> tuple[TrainState, StepMetrics]:
        """Advance the host clock and build the results. Excluded from ``torch.compile``;
        with ``nonfinite="raise"`` it reads the skip flag (a device sync)."""
        if self.nonfinite == "raise" and bool(out.skipped) and out.samples_backpropagated > 0:
            raise FloatingPointError(
                f"step {state.time.step}: the loss or a gradient is not finite (loss "
                f"{float(out.loss)}); the update was not applied. Pass nonfinite='skip' to "
                "make_train_step to skip such updates and count them instead"
            )
        t = state.time
        time = t._replace(
            step=t.step + 1,
            batch_in_epoch=t.batch_in_epoch + 1,
            samples_forwarded=t.samples_forwarded
            + out.samples_backpropagated
            + run.samples_scored,
            samples_backpropagated=t.samples_backpropagated + out.samples_backpropagated,
            updates_skipped=out.updates_skipped,
        )
        metrics = StepMetrics(
            out.loss, out.samples_in_batch, out.samples_backpropagated, out.skipped, run.traces
        )
        return run.persistent(time), metrics
