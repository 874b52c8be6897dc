"""The pure training step: host decisions, then one traceable core, then the host clock.

``step(state, batch)`` runs in three parts. :meth:`TrainStep.plan` decides on the host which
algorithms run on each of the 11 per-batch events (``match`` once per algorithm and event it
listens to, from ``state.time``; the order was fixed when the step was built, and plans are
cached by their decisions) and makes the time tensors. :meth:`TrainStep.core` does all the
tensor work (the algorithms' ``apply``, forward, loss, gradients, the gradient transform and
its update, the non-finite guard) and reads no Python number that changes from step to step.
:meth:`TrainStep.finish` advances the host :class:`~sbfunc.Time`.

:meth:`TrainStep.compile` compiles :meth:`TrainStep.core` alone, and ``plan`` and ``finish``
run as plain Python around it: one compiled frame per step and one graph per plan (Selective
Backprop on or off). Under ``torch.compile(step)`` the compiler traces
:meth:`TrainStep.__call__` (not ``nn.Module.__call__``) instead: ``plan`` and ``finish`` are
excluded (``torch.compiler.disable``), so a step is two compiled frames around the two host
calls, with the same graph of the core per plan; no other graph break. A text field
(a list of strings) reaches the compiled core as row indices
(:func:`sbfunc.batch.strings_as_row_indices`), so new strings never recompile it.
"""

from __future__ import annotations

import types
import zlib
from collections.abc import Sequence
from typing import Any, Literal, cast

import torch
from torch import nn

from sbfunc import random as sbrandom
from sbfunc.batch import PerSample, batch_size, strings_as_row_indices
from sbfunc.engine import (
    Algorithm,
    Carry,
    Event,
    Planner,
    State,
    Time,
    Trace,
    TrainState,
    stream_ids,
)
from sbfunc.engine.ordering import Pass
from sbfunc.engine.run import advance_time, apply_planned, run_event, step_key
from sbfunc.engine.writes import in_step
from sbfunc.module import LossFn, ModuleLoss, Params
from sbfunc.optim import GradientTransformation, apply_updates
from sbfunc.step.compile_guards import compile_options
from sbfunc.step.gradients import all_finite
from sbfunc.step.guard import count_unscorable, keep_finite, mask_corrupt_rows, raise_if_nonfinite
from sbfunc.step.microbatch import Microbatching, accumulate
from sbfunc.step.objective import INSIDE_EVENTS, Objective
from sbfunc.step.records import BATCH_EVENTS, Out, StepMetrics, StepPlan
from sbfunc.step.replicas import ONE_PROCESS, Replicas
from sbfunc.validation import check_int

__all__ = ["BATCH_EVENTS", "NonFinite", "StepMetrics", "StepPlan", "TrainStep"]


_MODEL_STREAM = zlib.crc32(b"sbfunc.model") | (1 << 40)  # never an algorithm's stream id
_INIT_STREAM = zlib.crc32(b"sbfunc.init") | (1 << 41)
NonFinite = Literal["skip", "raise", "allow"]


class TrainStep(nn.Module):
    """``step(state, batch) -> (state, metrics)``; build it with :func:`make_train_step`.

    It is an ``nn.Module`` only so that ``torch.compile(step)`` returns a module that still has
    :meth:`init` and :meth:`fire` (compiled modules forward attribute access); it has no
    parameters of its own.

    Example:
        >>> ce = torch.nn.functional.cross_entropy
        >>> loss_fn = sbfunc.per_sample_loss(torch.nn.Linear(2, 2), ce)
        >>> step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1))
        >>> state = step.init(*sbfunc.split_module(loss_fn.module), key=sbfunc.random.key(0))
        >>> step.fire(sbfunc.Event.EPOCH_END, state) == (state, ())  # no algorithm matches
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
    ) -> None:
        super().__init__()
        self.replicas = replicas
        self.microbatching = microbatching
        self.per_sample = per_sample
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.algorithms = tuple(algorithms)
        self.passes = tuple(passes)
        self.nonfinite = nonfinite
        self.keyed_model = keyed_model
        self.planner = Planner(self.algorithms, self.passes, BATCH_EVENTS)
        self.all_events = Planner(self.algorithms, self.passes, tuple(Event))
        self.leaves = self.planner.leaves
        self.objective = Objective(loss_fn, per_sample, nonfinite != "allow")
        self.writes = in_step(staged=isinstance(loss_fn, ModuleLoss))
        self.uses_elapsed = [leaf.label for leaf in self.leaves if leaf.algorithm.uses_elapsed]
        # torch.compile caches graphs per code object: this step's own copy of the traced core
        # keeps several compiled steps in one process out of each other's cache entries
        # (otherwise every call checks the guards of every step's entries).
        # (``__call__`` too: ``torch.compile(step)`` looks it up on the instance.)
        for name in ("__call__", "core"):
            fn = getattr(type(self), name)
            own = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__)
            setattr(self, name, types.MethodType(own, self))
        self.compiled_core: Any = None  # set by compile()
        self._host_plan = torch.compiler.disable(self._prepare)
        self._host_finish = torch.compiler.disable(self.finish)

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
                not match the module behind ``loss_fn`` (``sbfunc.module_checks.check_state``).
        """
        from sbfunc.module_checks import check_state

        sbrandom.check_key(key, "key")
        check_state(self.loss_fn, params, buffers)  # types, names and shapes on the host
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
        return self.fire(Event.INIT, state)[0]

    def fire(self, event: Event, state: TrainState) -> tuple[TrainState, tuple[Trace, ...]]:
        """Run one event outside the step (``INIT``, ``EPOCH_END``, ...) with this step's
        algorithms and order (see :func:`sbfunc.run_event`)."""
        return run_event(event, state, self.algorithms, self.passes, planner=self.all_events)

    def __call__(self, state: TrainState, batch: Any) -> tuple[TrainState, StepMetrics]:
        """One training step on ``batch``: ``plan``, ``core``, ``finish``.

        After :meth:`compile` the core is the compiled one; ``torch.compile(step)`` traces
        this method itself, with ``plan`` and ``finish`` excluded (see the module docs).
        """
        if torch.compiler.is_compiling():  # the host parts stay out of the graph
            plan, batch = self._host_plan(state, batch, True)
            carry, out = self.core(plan, state, batch)
            return self._host_finish(state, carry, out)
        if self.compiled_core is not None:  # step.compile(): host plan, compiled core
            plan, batch = self._prepare(state, batch, True)
            carry, out = self.compiled_core(plan, state, batch)
        else:
            plan = self.plan(state, batch)
            carry, out = self.core(plan, state, batch)
        return self.finish(state, carry, out)

    def compile(self, *, library_guards: bool = False, **options: Any) -> None:
        """Compile the step in place: :meth:`core` with ``torch.compile(**options)``, while
        :meth:`plan` and :meth:`finish` run as plain Python around it (``jax.jit`` of the
        pure part). The fastest way to compile a step: one compiled frame per call (the
        core's), where ``torch.compile(step)`` has two (the entry frame and the resume frame
        after the host plan), with the same graphs and results; and the guards on library
        globals left out (:mod:`sbfunc.step.compile_guards`), which on small models cost more
        than the step's arithmetic.

        Args:
            library_guards: keep the guards on sbfunc's, torch's and the standard library's
                globals too (``torch.compile``'s default; slower, and only needed if you
                patch those modules between steps).
            **options: passed to ``torch.compile`` (``backend``, ``mode``, ``fullgraph``,
                ``dynamic``, ``options``); a ``guard_filter_fn`` in ``options`` replaces
                the default one (see :func:`sbfunc.step.compile_guards.compile_options`).

        Raises:
            TypeError: if ``library_guards`` is not a bool.

        Example:
            >>> ce = torch.nn.functional.cross_entropy
            >>> loss_fn = sbfunc.per_sample_loss(torch.nn.Linear(2, 2), ce)
            >>> step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1))
            >>> step.compile(backend="eager", fullgraph=True)
            >>> state = step.init(*sbfunc.split_module(torch.nn.Linear(2, 2)),
            ...                   key=sbfunc.random.key(0))
            >>> state, m = step(state, (torch.randn(4, 2), torch.tensor([0, 1, 1, 0])))
            >>> state.time.step
            1

        References:
            ``torch.nn.Module.compile``; ``jax.jit``.
        """
        options = compile_options(options, library_guards=library_guards)
        self.compiled_core = torch.compile(self.core, **options)

    def forward(self, state: TrainState, batch: Any) -> tuple[TrainState, StepMetrics]:
        """The same as calling the step (``nn.Module``'s entry point)."""
        return self(state, batch)

    def _prepare(self, state: TrainState, batch: Any, compiling: bool) -> tuple[StepPlan, Any]:
        """The plan, and under compilation the batch with text fields as row indices (so the
        compiled core never guards on strings)."""
        if compiling:
            batch = strings_as_row_indices(batch, per_sample=self.per_sample)
        return self.plan(state, batch), batch

    def plan(self, state: TrainState, batch: Any) -> StepPlan:
        """Decide every per-batch event on the host (``match`` from ``state.time``; events
        after the update see ``step`` and ``batch_in_epoch`` advanced) and make the time
        tensors. Excluded from ``torch.compile``."""
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
                self.planner.empty, time.as_tensors(device) if self.keyed_model else None
            )
        after = time.advanced(forwarded=0, backpropagated=0)  # the counters after the update
        events = self.planner.decide(time, state.algorithm_state, after)
        need_time = self.keyed_model or bool(events)
        return StepPlan(events, time.as_tensors(device) if need_time else None)

    def _fire(self, plan: StepPlan, event: Event, carry: Carry, root: torch.Tensor) -> Carry:
        planned = self.planner.planned(plan.events, event)
        if not planned:
            return carry
        return apply_planned(event, planned, carry, self.leaves, root, writes=self.writes)

    def core(self, plan: StepPlan, state: TrainState, batch: Any) -> tuple[Carry, Out]:
        """The tensor work of one step under ``plan``; compiles with ``fullgraph=True`` for
        fixed-size selections. Returns the carry (the new persistent values) and the outputs."""
        root = state.key
        time = plan.time
        # no key until an algorithm is focused; no time when nothing reads it
        context = State(
            cast(torch.Tensor, None),
            state.params,
            state.buffers,
            state.opt_state,
            cast(Time, time),
            batch=batch,
        )
        carry = Carry(context, state.algorithm_state, (None,) * len(self.leaves))
        if time is not None:  # every key of the step derives from the step-start time
            carry = carry._replace(step_key=step_key(root, time.step))

        def fire(event: Event, c: Carry) -> Carry:
            return self._fire(plan, event, c, root)

        n_in = batch_size(batch, per_sample=self.per_sample)
        for event in BATCH_EVENTS[:4]:  # AFTER_DATALOADER ... BEFORE_FORWARD
            carry = fire(event, carry)
        skipped_so_far = state.time.updates_skipped
        if skipped_so_far is None:
            skipped_so_far = torch.zeros((), dtype=torch.int64, device=root.device)
        ok = None
        if self.nonfinite != "allow":  # a corrupt row costs one row (sbfunc.step.nonfinite)
            masked, ok = mask_corrupt_rows(carry.context.batch, per_sample=self.per_sample)
            carry = carry._replace(context=carry.context._replace(batch=masked))
        n_kept = batch_size(carry.context.batch, per_sample=self.per_sample)
        if n_kept == 0 and not self.replicas.collective:  # every row left: no update
            carry = advance_time(carry)
            carry = fire(Event.BATCH_END, carry)
            nan = torch.full((), torch.nan, device=skipped_so_far.device)
            done = torch.ones((), dtype=torch.bool, device=skipped_so_far.device)
            bad = None if self.nonfinite == "allow" else skipped_so_far.new_zeros(())
            return carry, Out(nan, n_in, 0, done, skipped_so_far + 1, bad)
        model_key = self._model_key if self.keyed_model else None
        inside = any(self.planner.planned(plan.events, e) for e in INSIDE_EVENTS)
        if n_kept == 0:  # no row here, the others may have some: contribute nothing
            grads = {k: torch.zeros_like(v) for k, v in carry.context.params.items()}
            loss = torch.zeros((), device=root.device)
            context = carry.context._replace(loss=loss, losses=loss.new_zeros(0), outputs=None)
            carry, used, n_bwd = carry._replace(context=context), None, 0
        else:
            carry, grads, loss, used, n_bwd = accumulate(
                self.objective,
                fire,
                carry,
                self.microbatching,
                per_sample=self.per_sample,
                inside=inside,
                model_key=model_key,
                ok=ok,
            )
        grads, loss, apply = self.replicas.mean(grads, loss, n_bwd)
        buffers = self.replicas.sync_buffers(carry.context.buffers)
        context = carry.context._replace(grads=grads, buffers=buffers)
        carry = fire(Event.AFTER_BACKWARD, carry._replace(context=context))
        context = carry.context
        grads = grads if context.grads is None else context.grads
        updates, opt_state = self.optimizer.update(grads, context.opt_state, context.params)
        params = apply_updates(context.params, updates)
        checked = None if self.nonfinite == "allow" else all_finite(loss, grads)
        if apply is not None:
            checked = apply if checked is None else checked & apply
        finite, (params, opt_state, buffers) = keep_finite(
            checked,
            (params, opt_state, context.buffers),
            (context.params, context.opt_state, state.buffers),
            device=loss.device,
        )
        context = context._replace(params=params, opt_state=opt_state, buffers=buffers)
        carry = advance_time(carry._replace(context=context))
        carry = fire(Event.AFTER_TRAIN_BATCH, carry)
        carry = fire(Event.BATCH_END, carry)
        bad = None if used is None else (~used).sum()  # rows in the update left out
        if bad is None and self.nonfinite != "allow":
            bad = skipped_so_far.new_zeros(())
        return carry, Out(loss, n_in, n_bwd, ~finite, skipped_so_far + (~finite).long(), bad)

    def _model_key(self, base: torch.Tensor) -> torch.Tensor:
        """The key the model's random operations (dropout) draw from in this step."""
        return self.replicas.model_key(sbrandom.fold_in(base, _MODEL_STREAM))

    def finish(self, state: TrainState, carry: Carry, out: Out) -> tuple[TrainState, StepMetrics]:
        """Advance the host clock and build the results. Excluded from ``torch.compile``;
        with ``nonfinite="raise"`` it reads the skip flag (a device sync)."""
        context = carry.context
        out = count_unscorable(out, context.rows_unscorable)  # selection's dropped rows too
        if self.nonfinite == "raise":
            raise_if_nonfinite(out, state.time.step, self.replicas)
        scored = context.samples_scored
        time = state.time.advanced(
            forwarded=out.samples_backpropagated + scored,
            backpropagated=out.samples_backpropagated,
        )
        rows_bad = time.rows_nonfinite
        if out.rows_nonfinite is not None and rows_bad is not None:
            rows_bad = rows_bad + out.rows_nonfinite
        time = time._replace(updates_skipped=out.updates_skipped, rows_nonfinite=rows_bad)
        metrics = StepMetrics(
            out.loss,
            out.samples_in_batch,
            out.samples_backpropagated,
            out.skipped,
            carry.traces,
            out.rows_nonfinite,
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
