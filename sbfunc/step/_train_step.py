"""The training step: ``step(state, batch) -> (state, metrics)``, a pure function.

Same ``state`` and ``batch``, same result: every random draw derives from ``state.key``, and
nothing outside the arguments changes. A step is three parts, read top to bottom here:
:meth:`TrainStep.plan` decides on the host which algorithms run on each event (``match`` from
``state.time``; plans are cached by their decisions); :meth:`TrainStep.core` does all the
tensor work and reads no Python number that changes from step to step (the events before the
forward, the rows it cannot train on set aside, forward and gradients
(:func:`~sbfunc.step._microbatch.accumulate`), ``AFTER_BACKWARD``, the update kept only when
finite, the events after); :meth:`TrainStep.finish` advances the host clock and builds the
:class:`StepMetrics`. ``step.compile()`` compiles the core alone (``compile_options``). The
walk-through, with the non-finite policy and how it compiles: ``docs/concepts/step.md``.
"""

from __future__ import annotations

import itertools
import types
import zlib
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from torch import nn

from sbfunc import random as sbrandom
from sbfunc._finite import keep_if_finite, substitute_rows, trainable_rows, update_finite
from sbfunc._tracing import host_flag, host_readable
from sbfunc.batch import batch_size, strings_as_row_indices
from sbfunc.engine import Algorithm, Context, Event, Pass, Time, Trace, TrainState, run_event
from sbfunc.engine.internal import (
    Carry,
    Clock,
    Planner,
    advance_time,
    apply_planned,
    in_step,
    step_key,
)
from sbfunc.module import ModuleLoss
from sbfunc.optim import (
    GradientTransformation,
    apply_updates,
    loss_scale,
    scales_loss,
    state_on_skip,
    takes_items,
    unscale,
)
from sbfunc.step._compile import compile_options
from sbfunc.step._init import initial_state
from sbfunc.step._microbatch import Microbatching, accumulate
from sbfunc.step._objective import (
    AUTOCAST,
    INSIDE_EVENTS,
    Fire,
    Objective,
    ObjectiveKind,
    Precision,
)
from sbfunc.step._records import (
    BATCH_EVENTS,
    CoreOutputs,
    Gradients,
    NonFinite,
    StepMetrics,
    StepPlan,
)
from sbfunc.step._replicas import ONE_PROCESS, Replicas, no_rows_here
from sbfunc.types import LossFn, Params, PerSample

__all__ = ["TrainStep"]

_MODEL_STREAM = zlib.crc32(b"sbfunc.model") | (1 << 40)  # never an algorithm's stream id
_BEFORE_FORWARD = BATCH_EVENTS[:4]  # AFTER_DATALOADER ... BEFORE_FORWARD
_LOSS_EVENTS = (Event.AFTER_LOSS, Event.BEFORE_BACKWARD)
# the methods torch.compile traces as frames of their own: each step gets its own code
# objects, so a call never checks the guards of another step's graphs, and its own code
# names, so torch's automatic-dynamic record (kept per file, line and code name for the whole
# process) never turns one step's hyperparameters symbolic because another step's differ
_TRACED = ("__call__", "compiled_body", "core")
_SERIAL = itertools.count()


class TrainStep(nn.Module):
    """``step(state, batch) -> (state, metrics)``; build it with :func:`make_train_step`.

    An ``nn.Module`` with no parameters of its own, only so that ``torch.compile(step)``
    returns a module that still has the step's other methods (``init``, ``run_event``);
    ``step.compile()`` compiles it in place.

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
        serial = next(_SERIAL)
        for name in _TRACED:  # this step's own code objects: its own compile cache entries
            fn = getattr(type(self), name)
            code = fn.__code__.replace(co_name=f"{name}_step{serial}")
            setattr(self, name, types.MethodType(types.FunctionType(code, fn.__globals__), self))
        self.compiled_core: Any = None  # set by compile()
        self.loss_fn, self.optimizer, self.per_sample = loss_fn, optimizer, per_sample
        self.algorithms, self.passes = tuple(algorithms), tuple(passes)
        self.nonfinite, self.keyed_model, self.precision = nonfinite, keyed_model, precision
        self.replicas, self.microbatching = replicas, microbatching
        self.scales_loss = scales_loss(optimizer)  # dynamic_loss_scale: scale the loss
        self.takes_items = takes_items(optimizer)  # multi_steps(by_items=True): pass them
        module_loss = isinstance(loss_fn, ModuleLoss)
        self.usable = loss_fn.usable_rows if isinstance(loss_fn, ModuleLoss) else None
        # frozen parameters given in buffers: never written by a forward, so never copied,
        # synchronised or guarded (a frozen base can be most of the model)
        constants = loss_fn.parameter_names() if isinstance(loss_fn, ModuleLoss) else None
        self.constants = constants or frozenset()
        self.planner = Planner(self.algorithms, self.passes, BATCH_EVENTS)
        self.all_events = Planner(self.algorithms, self.passes, tuple(Event))
        self.leaves = self.planner.leaves
        self.objective = Objective(
            loss_fn, per_sample, nonfinite != "allow", AUTOCAST[precision], objective,
            self.constants,
        )  # fmt: skip
        self.writes = in_step(staged=module_loss)
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
                not match the module behind ``loss_fn`` (``sbfunc.module.check_state``: names,
                shapes, a frozen parameter given as trainable).
        """
        state = initial_state(
            self.loss_fn, self.optimizer, self.algorithms, self.replicas,
            params, buffers, key=key, total_steps=total_steps,
        )  # fmt: skip
        return self.run_event(Event.INIT, state)[0]

    def run_event(self, event: Event, state: TrainState) -> tuple[TrainState, tuple[Trace, ...]]:
        """Run one event outside the step (``INIT``, ``EPOCH_END``, ...) with this step's
        algorithms and order (see :func:`sbfunc.engine.run_event`)."""
        return run_event(event, state, self.algorithms, self.passes, planner=self.all_events)

    # --- calling and compiling ----------------------------------------------------------------

    def __call__(self, state: TrainState, batch: Any) -> tuple[TrainState, StepMetrics]:
        """One training step on ``batch``: :meth:`plan`, :meth:`core`, :meth:`finish`.

        After :meth:`compile` the core is the compiled one; ``torch.compile(step)`` traces
        this method itself, with ``plan`` and ``finish`` excluded (two compiled frames around
        the two host calls, the same graph of the core per plan). Compiled either way, a text
        field reaches the core as row indices (``sbfunc.batch.strings_as_row_indices``), so new
        strings never recompile it.
        """
        if torch.compiler.is_compiling():  # the host parts stay out of the graph (wrapped
            # here, not at construction: torch.compiler.disable imports torch._dynamo)
            plan, batch = torch.compiler.disable(self._prepare)(state, batch)
            carry, out = self.compiled_body(plan, state, batch)
            return torch.compiler.disable(self.finish)(state, carry, out)
        if self.compiled_core is not None:  # step.compile(): host plan, compiled core
            plan, batch = self._prepare(state, batch)
            carry, out = self.compiled_core(plan, state, batch)
        else:
            plan = self.plan(state, batch)
            carry, out = self.core(plan, state, batch)
        return self.finish(state, carry, out)

    def compiled_body(
        self, plan: StepPlan, state: TrainState, batch: Any
    ) -> tuple[Carry, CoreOutputs]:
        """What a compiled step runs: :meth:`core`, returning only what :meth:`finish` reads
        (a graph's outputs are materialised: the per-batch values would cost allocations)."""
        carry, out = self.core(plan, state, batch)
        return carry.outliving(), out

    def forward(self, state: TrainState, batch: Any) -> tuple[TrainState, StepMetrics]:
        """The same as calling the step (``nn.Module``'s entry point)."""
        return self(state, batch)

    def compile(self, *, library_guards: bool = False, **options: Any) -> None:
        """Compile the step in place: :meth:`core` with ``torch.compile(**options)``, while
        :meth:`plan` and :meth:`finish` run as plain Python around it (``jax.jit`` of the
        pure part): one compiled frame per call, where ``torch.compile(step)`` has two, with
        the same graphs and results, and the guards on library globals left out
        (:func:`~sbfunc.step._compile.drop_library_globals`; ``docs/how-to/compile.md``).

        Args:
            library_guards: keep the guards on sbfunc's, torch's and the standard library's
                globals too (``torch.compile``'s default; slower, and only needed if you
                patch those modules between steps).
            **options: passed to ``torch.compile`` (``backend``, ``mode``, ``fullgraph``,
                ``dynamic``, ``options``); a ``guard_filter_fn`` in ``options`` replaces
                the default one. The step's hyperparameters are constants of its graphs,
                whatever other steps the process compiles; a batch of a new size recompiles
                once with a dynamic batch dimension.

        Raises:
            TypeError: if ``library_guards`` is not a bool.
            ValueError: if ``dynamic=True`` (it would make the hyperparameters symbolic).

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
        self.compiled_core = torch.compile(self.compiled_body, **options)

    def _prepare(self, state: TrainState, batch: Any) -> tuple[StepPlan, Any]:
        """The plan, and the batch with text fields as row indices (a compiled core never
        guards on strings)."""
        batch = strings_as_row_indices(batch, per_sample=self.per_sample)
        return self.plan(state, batch), batch

    # --- the host plan -------------------------------------------------------------------------

    def plan(self, state: TrainState, batch: Any) -> StepPlan:
        """Decide every per-batch event on the host (``match`` from ``state.time``; events
        after the update see ``step`` and ``batch_in_epoch`` advanced) and pack the time
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
        events = self.planner.empty
        if self.leaves:
            after = time.advanced(forwarded=0, backpropagated=0)  # the counters after the update
            events = self.planner.decide(time, state.algorithm_state, after)
        need_time = self.keyed_model or bool(events)
        return StepPlan(events, Clock.of(time, state.key.device) if need_time else None)

    # --- the tensor core -----------------------------------------------------------------------

    def core(self, plan: StepPlan, state: TrainState, batch: Any) -> tuple[Carry, CoreOutputs]:
        """The tensor work of one step under ``plan``: the carry (the new persistent values)
        and the outputs. Compiles with ``fullgraph=True`` for fixed-size selections."""
        fire = self._firing(plan, state.key)
        carry = self._start(plan, state, batch)
        rows = batch_size(batch, per_sample=self.per_sample)
        for event in _BEFORE_FORWARD:  # selection (Selective Backprop) happens here
            carry = fire(event, carry)
        skipped = state.time.updates_skipped
        if skipped is None:  # a hand-made Time: none skipped so far
            skipped = torch.zeros((), dtype=torch.int64, device=state.key.device)
        kept = batch_size(carry.context.batch, per_sample=self.per_sample)
        if kept == 0 and not self.replicas.collective:  # no row on any process: no update
            carry = fire(Event.BATCH_END, advance_time(carry))
            nan = torch.full((), torch.nan, device=skipped.device)
            done = torch.ones((), dtype=torch.bool, device=skipped.device)
            bad = self._rows_left_out(carry, None, skipped, state.time)
            return carry, CoreOutputs(nan, rows, 0, done, skipped + 1, *bad)
        if kept == 0:  # no row here, the other processes have some: contribute nothing
            g = no_rows_here(carry, state.key.device)
        else:
            carry, ok = self._set_aside(carry)  # a corrupt row costs one row
            g = self._gradients(plan, carry, fire, ok, state.key)
        carry, loss, finite = self._update(g, state, fire)
        carry = advance_time(carry)
        carry = fire(Event.BATCH_END, fire(Event.AFTER_TRAIN_BATCH, carry))
        bad = self._rows_left_out(carry, g.used, skipped, state.time)
        unused = None if g.used is None else (~g.used).sum()
        updates_skipped = skipped + (~finite).long()
        return carry, CoreOutputs(
            loss, rows, g.rows, ~finite, updates_skipped, *bad, rows_unused=unused, tokens=g.tokens
        )

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

    def _set_aside(self, carry: Carry) -> tuple[Carry, torch.Tensor | None]:
        """``(carry, ok)``: the rows the step cannot train on (a non-finite input; for a
        :func:`sbfunc.per_sample_loss`, no real target token or attention position) replaced
        by a usable row's copy, which the loss gives no weight, and the ``Tensor[N]`` mask of
        usable rows; ``(carry, None)`` with ``nonfinite="allow"``, when nothing can be wrong,
        or when every row is known usable (eagerly on the CPU, where reading costs no sync)."""
        if self.nonfinite == "allow":
            return carry, None
        batch = carry.context.batch
        usable = None if self.usable is None else self.usable(batch)
        ok = trainable_rows(batch, usable, per_sample=self.per_sample)
        if ok is None or host_flag(ok.all()):
            return carry, None
        batch = substitute_rows(batch, ok, per_sample=self.per_sample)
        return carry._replace(context=carry.context._replace(batch=batch)), ok

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

    def _update(
        self, g: Gradients, state: TrainState, fire: Fire
    ) -> tuple[Carry, torch.Tensor, torch.Tensor]:
        """The other processes' share (data-parallel), ``AFTER_BACKWARD``, the optimizer's
        update, kept only when the loss and every gradient are finite (optax's
        ``apply_if_finite``, without a host sync): ``(carry, loss, finite)``."""
        grads, loss, apply, buffers = g.grads, g.loss, None, g.carry.context.buffers
        if self.replicas.collective:
            grads, loss, apply = self.replicas.mean(grads, loss, g.rows)
            buffers = _merged(buffers, self.replicas.sync_buffers(self._mutable(buffers)))
        carry = g.carry._replace(context=g.carry.context._replace(grads=grads, buffers=buffers))
        carry = fire(Event.AFTER_BACKWARD, carry)
        context = carry.context
        grads = grads if context.grads is None else context.grads
        items = {"items": _items(g.tokens, g.used, g.rows)} if self.takes_items else {}
        updates, opt_state = self.optimizer.update(
            grads, context.opt_state, context.params, **items
        )
        new = (apply_updates(context.params, updates), opt_state, self._mutable(context.buffers))
        old = (
            context.params,
            state_on_skip(opt_state, context.opt_state),
            self._mutable(state.buffers),
        )
        finite, (params, opt_state, kept) = self._keep(loss, grads, apply, new, old)
        context = context._replace(
            params=params, opt_state=opt_state, buffers=_merged(context.buffers, kept)
        )
        return carry._replace(context=context), loss, finite

    def _keep(
        self, loss: torch.Tensor, grads: Params, apply: torch.Tensor | None, new: Any, old: Any
    ) -> tuple[torch.Tensor, Any]:
        """``(finite, new)`` when the loss and gradients are finite (always with ``"allow"``)
        and ``apply`` (the replicas' flag; ``None``: none) holds, else ``(finite, old)``: one
        ``torch.where`` per tensor on a device or under the compiler; eagerly on the CPU the
        flag is a host value already, and a branch skips the selects."""
        checked = None if self.nonfinite == "allow" else update_finite(loss, grads)
        if apply is not None:
            checked = apply if checked is None else checked & apply
        if checked is None:
            return torch.ones((), dtype=torch.bool, device=loss.device), new
        host = host_flag(checked)
        if host is not None:
            return checked, new if host else old
        return checked, keep_if_finite(checked, new, old)

    def _rows_left_out(
        self, carry: Carry, used: torch.Tensor | None, like: torch.Tensor, time: Time
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``(this step's left-out rows, the run's count after it)``: the rows the update
        left out (``used``: the rows the loss used; ``None``: all) and those a selection left
        out for a non-finite score (``Context.rows_unscorable``), 0-d ``int64``; ``None``
        with ``"allow"`` (the run's count then stays as it was)."""
        bad = None if self.nonfinite == "allow" else like.new_zeros(())
        if used is not None:
            bad = (~used).sum()
        unscorable = carry.context.rows_unscorable
        if bad is not None and unscorable is not None:
            bad = bad + unscorable.to(bad.device)
        total = time.rows_nonfinite
        return bad, total if bad is None or total is None else total + bad

    def _model_key(self, base: torch.Tensor) -> torch.Tensor:
        """The key the model's random operations (dropout) draw from in this step."""
        key = sbrandom.fold_in(base, _MODEL_STREAM)
        return self.replicas.model_key(key) if self.replicas.collective else key

    def _mutable(self, buffers: Params) -> Params:
        """The buffers a forward may write (every one but the frozen parameters)."""
        if not self.constants:
            return buffers
        return {k: v for k, v in buffers.items() if k not in self.constants}

    # --- the host finish -----------------------------------------------------------------------

    def finish(
        self, state: TrainState, carry: Carry, out: CoreOutputs
    ) -> tuple[TrainState, StepMetrics]:
        """Advance the host clock and build the results. Excluded from ``torch.compile``;
        with ``nonfinite="raise"`` it reads the skip flag (a device sync)."""
        if self.nonfinite == "raise":
            _raise_if_nonfinite(out, state.time.step, self.replicas)
        context = carry.context
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
            context.params, context.buffers, state.key, context.opt_state,
            carry.algorithm_state, time,
        )  # fmt: skip
        return new, metrics


def _merged(buffers: Params, part: Params) -> Params:
    """``buffers`` with the entries of ``part`` (a subset of its names) replaced, in order."""
    if len(part) == len(buffers):  # every entry (not `part is buffers`: torch 2.11's Dynamo
        return part  # cannot trace `is` between two dicts)
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


def _raise_if_nonfinite(out: CoreOutputs, step: int, replicas: Replicas) -> None:
    """``nonfinite="raise"``: raise for a skipped update (on every rank when any rank had
    rows) or for rows left out of it (reads the flags: a sync)."""
    had_rows = out.samples_backpropagated > 0
    if (had_rows or replicas.collective) and bool(out.skipped) and replicas.any_rank(had_rows):
        where = " on some rank" if replicas.collective else ""
        raise FloatingPointError(
            f"step {step}: the loss or a gradient is not finite{where} (loss "
            f"{float(out.loss)}); the update was not applied. Pass nonfinite='skip' to "
            "make_train_step to skip such updates and count them instead"
        )
    bad = 0 if out.rows_nonfinite is None else int(out.rows_nonfinite)
    if bad:
        raise FloatingPointError(
            f"step {step}: {bad} of {out.samples_in_batch} rows have an input or loss that "
            "is not finite. Pass nonfinite='skip' to make_train_step to leave such rows out "
            "of the update and count them instead"
        )
