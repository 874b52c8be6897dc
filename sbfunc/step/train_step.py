"""The pure training step: per-batch events through the engine, torch.func gradients, an
optax-style optimizer update."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import torch
from torch.func import grad_and_value, vjp

from sbfunc.batch import batch_size
from sbfunc.engine import Algorithm, Event, State, Trace, run_event
from sbfunc.module import LossFn, ModuleLoss, Params
from sbfunc.passes import DEFAULT_PASSES

__all__ = ["BATCH_EVENTS", "Optimizer", "StepMetrics", "TrainStep", "make_train_step"]

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

Pass = Callable[[Sequence[Algorithm], Event], list[Algorithm]]


class Optimizer(Protocol):
    """An optax-style optimizer: ``init(params)`` and ``update(grads, state, *, params,
    inplace)``, as torchopt's functional optimizers (``torchopt.sgd``, ``torchopt.adam``).

    Example:
        >>> import torchopt
        >>> opt: sbfunc.Optimizer = torchopt.sgd(0.1)
        >>> params = {"w": torch.ones(2)}
        >>> updates, _ = opt.update({"w": torch.ones(2)}, opt.init(params), params=params,
        ...                         inplace=False)
        >>> updates["w"]
        tensor([-0.1000, -0.1000])

    References:
        DeepMind optax ``GradientTransformation``; torchopt's functional optimizers.
    """

    def init(self, params: Any) -> Any: ...

    def update(
        self, updates: Any, state: Any, *, params: Any = ..., inplace: bool = ...
    ) -> Any: ...


class StepMetrics(NamedTuple):
    """What one step reports.

    Attributes:
        loss: the (weighted) mean training loss of the backpropagated rows, a 0-d tensor
            (left on the device: reading it is the caller's choice of sync).
        samples_in_batch: rows the data loader delivered.
        samples_backpropagated: rows the gradient was computed on (after selection).
        traces: the engine's traces of every event of the step, in order.

    Example:
        >>> m = sbfunc.StepMetrics(torch.tensor(0.5), 64, 32, ())
        >>> m.samples_backpropagated / m.samples_in_batch
        0.5

    References:
        MosaicML Composer ``State`` (``batch``, ``loss``) and ``Trace``.
    """

    loss: torch.Tensor
    samples_in_batch: int
    samples_backpropagated: int
    traces: tuple[Trace, ...]


def weighted_mean(losses: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """``mean(weights * losses)`` over the rows (plain mean without weights).

    Selection policies return importance weights normalised for this estimator: the weighted
    mean over the kept rows estimates the mean loss over the whole batch.

    Example:
        >>> sbfunc.weighted_mean(torch.tensor([1.0, 3.0]), torch.tensor([2.0, 0.0]))
        tensor(1.)

    References:
        Horvitz and Thompson 1952 (inverse-probability weights); Katharopoulos and Fleuret
        2018, "Not All Samples Are Created Equal" (unbiased importance-sampled SGD).
    """
    if weights is None:
        return losses.mean()
    if weights.shape != losses.shape:
        raise ValueError(
            f"sample_weights of shape {tuple(weights.shape)} do not match the per-sample losses "
            f"of shape {tuple(losses.shape)}; a selection must weight exactly its kept rows"
        )
    return (weights.to(losses.dtype) * losses).mean()


def _end_of_batch(state: State) -> State:
    # The per-batch fields live for one step only: a state between steps has a fixed
    # structure (so it checkpoints against a fresh template) and holds no batch tensors.
    return state.replace(batch=None, outputs=None, loss=None, sample_weights=None)


def _fresh(buffers: Params) -> Params:
    return {k: v.clone() for k, v in buffers.items()}


class TrainStep:
    """``step(state, batch) -> (state, metrics)``; build it with :func:`make_train_step`.

    It also carries its ``algorithms`` and ``passes`` so the loop helper fires the epoch-level
    events on the same list (:meth:`fire`).

    Example:
        >>> import torchopt
        >>> ce = torch.nn.functional.cross_entropy
        >>> loss_fn = sbfunc.per_sample_loss(torch.nn.Linear(2, 2), ce)
        >>> step = sbfunc.make_train_step(loss_fn, torchopt.sgd(0.1))
        >>> state = sbfunc.init_state({}, {}, key=sbfunc.random.key(0))
        >>> step.fire(sbfunc.Event.INIT, state) == (state, ())  # no algorithm matches
        True

    References:
        MosaicML Composer ``Engine`` and ``Trainer``.
    """

    def __init__(
        self,
        loss_fn: LossFn,
        optimizer: Optimizer,
        algorithms: Sequence[Algorithm],
        passes: Sequence[Pass],
    ) -> None:
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.algorithms = tuple(algorithms)
        self.passes = tuple(passes)

    def fire(self, event: Event, state: State) -> tuple[State, tuple[Trace, ...]]:
        """Run one event through the engine with this step's algorithms and passes."""
        return run_event(event, state, self.algorithms, self.passes)

    def __call__(self, state: State, batch: Any) -> tuple[State, StepMetrics]:
        n_in = batch_size(batch)
        traces: list[Trace] = []
        state = state.replace(batch=batch, outputs=None, loss=None, sample_weights=None)

        def fire(event: Event) -> None:
            nonlocal state
            state, tr = self.fire(event, state)
            traces.extend(tr)

        for event in BATCH_EVENTS[:4]:  # AFTER_DATALOADER ... BEFORE_FORWARD
            fire(event)
        if batch_size(state.batch) == 0:  # every row is queued for later (refill): no update
            return self._no_update(state, n_in, traces)
        # Train-mode BatchNorm writes its statistics into the buffers in place: give it fresh
        # copies made inside the transform (mutating captured tensors is refused there) and
        # return them as aux, so the caller's buffers are never written.
        buffers = state.buffers
        loss_fn = self.loss_fn
        staged = isinstance(loss_fn, ModuleLoss)
        backward: Callable[[], Params]
        if staged:
            assert isinstance(loss_fn, ModuleLoss)
            fwd_batch = state.batch

            def forward(p: Params) -> tuple[Any, Params]:
                b = _fresh(buffers)
                return loss_fn.forward(p, b, fwd_batch), b

            outputs, pullback, new_buffers = vjp(forward, state.params, has_aux=True)  # type: ignore[misc]
            state = state.replace(outputs=outputs, buffers=new_buffers)
        fire(Event.AFTER_FORWARD)
        fire(Event.BEFORE_LOSS)
        loss_batch, weights = state.batch, state.sample_weights
        if staged:
            assert isinstance(loss_fn, ModuleLoss)
            g_out, loss = grad_and_value(
                lambda o: weighted_mean(loss_fn.criterion(o, loss_batch), weights)
            )(state.outputs)

            def backward() -> Params:
                (grads,) = pullback(g_out)
                return grads

        else:

            def fused(p: Params) -> tuple[torch.Tensor, Params]:
                b = _fresh(buffers)
                return weighted_mean(loss_fn(p, b, loss_batch), weights), b

            grads_fused, (loss, new_buffers) = grad_and_value(fused, has_aux=True)(state.params)
            state = state.replace(buffers=new_buffers)

            def backward() -> Params:
                return grads_fused

        n_bwd = batch_size(loss_batch)
        state = state.replace(loss=loss.detach())
        fire(Event.AFTER_LOSS)
        fire(Event.BEFORE_BACKWARD)
        grads = backward()
        fire(Event.AFTER_BACKWARD)
        updates, opt_state = self.optimizer.update(
            grads, state.opt_state, params=state.params, inplace=False
        )
        params = {k: state.params[k] + updates[k] for k in state.params}
        t = state.time
        state = state.replace(
            params=params,
            opt_state=opt_state,
            time=t._replace(
                step=t.step + 1,
                batch_in_epoch=t.batch_in_epoch + 1,
                samples_forwarded=t.samples_forwarded + n_bwd,
                samples_backpropagated=t.samples_backpropagated + n_bwd,
            ),
        )
        fire(Event.AFTER_TRAIN_BATCH)
        fire(Event.BATCH_END)
        state = _end_of_batch(state)
        return state, StepMetrics(loss.detach(), n_in, n_bwd, tuple(traces))

    def _no_update(
        self, state: State, n_in: int, traces: list[Trace]
    ) -> tuple[State, StepMetrics]:
        t = state.time
        state = state.replace(
            time=t._replace(step=t.step + 1, batch_in_epoch=t.batch_in_epoch + 1)
        )
        state, tr = self.fire(Event.BATCH_END, state)
        traces.extend(tr)
        state = _end_of_batch(state)
        nan = torch.full((), torch.nan)
        return state, StepMetrics(nan, n_in, 0, tuple(traces))


def make_train_step(
    loss_fn: LossFn,
    optimizer: Optimizer,
    algorithms: Sequence[Algorithm] = (),
    passes: Sequence[Pass] = DEFAULT_PASSES,
) -> TrainStep:
    """Build a pure training step ``step(state, batch) -> (state, metrics)``.

    One call fires the per-batch events :data:`BATCH_EVENTS` in Composer's order through
    :func:`sbfunc.run_event`, and between them:

    * after ``BEFORE_FORWARD``: the forward, ``torch.func.vjp`` of ``loss_fn.forward`` (for a
      :class:`sbfunc.ModuleLoss`; ``state.outputs`` is set for ``AFTER_FORWARD``);
    * after ``BEFORE_LOSS``: ``torch.func.grad_and_value`` of the weighted mean of the
      per-sample losses of ``state.batch`` (so targets changed on ``BEFORE_LOSS`` count), with
      ``state.sample_weights`` from selection policies (see :func:`weighted_mean`);
    * after ``BEFORE_BACKWARD``: the backward (the pull-back of the output gradient);
    * after ``AFTER_BACKWARD``: the optimizer update ``optimizer.update(grads, opt_state,
      params=params, inplace=False)`` and ``params + updates``.

    For a plain :data:`LossFn` the forward, loss and backward all run at the loss stage and
    ``state.outputs`` stays ``None``. After ``BATCH_END`` the per-batch fields (``batch``,
    ``outputs``, ``loss``, ``sample_weights``) are reset to ``None``: the state between steps
    has the structure of a fresh :func:`sbfunc.init_state` (checkpoints load against one) and
    the loss is reported in the metrics.

    A batch left with **zero rows** after ``BEFORE_FORWARD`` (Selective Backprop with
    ``refill`` queues its kept rows until a full batch is ready) makes no update: only
    ``BATCH_END`` fires, the loader batch still counts in ``time.step`` and
    ``time.batch_in_epoch`` (so durations stay in loader batches), and the metrics report a
    NaN loss and 0 backpropagated rows. Nothing is mutated: buffers are copied before a
    train-mode forward writes BatchNorm statistics, and the new state is returned.

    Args:
        loss_fn: the per-sample training loss (``sbfunc.per_sample_loss(..., train=True)``).
        optimizer: an optax-style optimizer such as ``torchopt.adam(1e-3)``.
        algorithms: the algorithms to run (see :func:`sbfunc.chain`).
        passes: the ordering passes (default :data:`sbfunc.passes.DEFAULT_PASSES`).

    Example:
        >>> import torchopt
        >>> model = torch.nn.Linear(4, 3)
        >>> loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy, train=True)
        >>> params, buffers = sbfunc.split_module(model, clone=True)
        >>> optimizer = torchopt.sgd(0.1)
        >>> state = sbfunc.init_state(params, buffers, key=sbfunc.random.key(0),
        ...                           opt_state=optimizer.init(params))
        >>> step = sbfunc.make_train_step(loss_fn, optimizer)
        >>> state, metrics = step(state, (torch.randn(8, 4), torch.randint(0, 3, (8,))))
        >>> state.time.step, metrics.samples_backpropagated
        (1, 8)

    References:
        MosaicML Composer's training loop events; optax's ``init``/``update`` optimizers
        (torchopt port).
    """
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
    if not (
        callable(getattr(optimizer, "init", None)) and callable(getattr(optimizer, "update", None))
    ):
        raise TypeError(
            "optimizer must have init(params) and update(grads, state, params=..., inplace=...) "
            f"(e.g. torchopt.adam(1e-3)); got {type(optimizer).__name__}"
        )
    algorithms = tuple(algorithms)
    for a in algorithms:
        if not isinstance(a, Algorithm):
            raise TypeError(
                f"algorithms must be sbfunc.Algorithm instances, got {type(a).__name__}"
            )
    return TrainStep(loss_fn, optimizer, algorithms, tuple(passes))
