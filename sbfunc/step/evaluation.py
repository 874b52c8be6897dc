"""Evaluation inside :func:`sbfunc.fit`: Composer's ``EVAL_*`` events around a pure metric
function, and the record of one evaluation."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

import optree
import torch

from sbfunc import random as sbrandom
from sbfunc.batch import batch_size
from sbfunc.engine import Clock, Event, Run, TrainState, apply_planned, plan_event

if TYPE_CHECKING:
    from sbfunc.step.train_step import TrainStep

__all__ = ["EvalFn", "Evaluation", "evaluate"]

EvalFn = Callable[[dict[str, torch.Tensor], dict[str, torch.Tensor], Any], Any]
"""``eval_fn(params, buffers, batch) -> metrics``: a pytree of per-batch means (0-d tensors)."""

_EVAL_STREAM = zlib.crc32(b"sbfunc.eval") | (1 << 43)  # never another stream id


class Evaluation(NamedTuple):
    """One evaluation run by :func:`sbfunc.fit`.

    Attributes:
        step: ``time.step`` when it ran (steps done).
        epoch: ``time.epoch`` when it ran (epochs done when it follows an epoch's end).
        event: the training event it followed: ``BATCH_END``, ``EPOCH_END`` or ``FIT_END``.
        metrics: the ``eval_fn`` metrics averaged over every evaluation row (each batch's
            metrics weighted by its number of rows), tensors left on the device.

    Example:
        >>> e = sbfunc.step.Evaluation(6, 2, sbfunc.Event.EPOCH_END, {"loss": torch.tensor(0.5)})
        >>> e.event.name, e.metrics["loss"]
        ('EPOCH_END', tensor(0.5000))

    References:
        MosaicML Composer ``Evaluator`` and ``Trainer.eval`` (metrics per evaluation).
    """

    step: int
    epoch: int
    event: Event
    metrics: Any


def _fire_on_batch(
    step: TrainStep, event: Event, state: TrainState, batch: Any, outputs: Any, index: int
) -> tuple[TrainState, Any, Any]:
    """Fire an evaluation batch event: the algorithms see (and may change) ``batch`` and
    ``outputs``; keys differ from batch to batch."""
    run = Run.start(state, batch, None)._replace(outputs=outputs)
    planned = plan_event(event, run, step.algorithms, step.passes)
    if not planned:
        return state, batch, outputs
    clock = Clock.of(state.time, state.key.device)
    step_key = sbrandom.fold_in(sbrandom.fold_in(state.key, clock.step), _EVAL_STREAM + index)
    run = run._replace(clock=clock, step_key=step_key)
    run = apply_planned(event, planned, run, step.algorithms, step.labels, step.streams)
    return run.persistent(state.time), run.batch, run.outputs


def _weighted_add(total: Any, metrics: Any, rows: int) -> Any:
    def scale(m: Any) -> Any:
        return m.detach() * rows if isinstance(m, torch.Tensor) else m * rows

    scaled = optree.tree_map(scale, metrics)
    if total is None:
        return scaled
    return optree.tree_map(lambda a, b: a + b, total, scaled)


def evaluate(
    step: TrainStep, state: TrainState, data: Iterable[Any], eval_fn: EvalFn
) -> tuple[TrainState, Any]:
    """Evaluate ``state`` on ``data``, firing the evaluation events with ``step``'s algorithms.

    Fires ``EVAL_BEFORE_ALL``, ``EVAL_START``, per batch ``EVAL_BATCH_START``,
    ``EVAL_BEFORE_FORWARD`` (the algorithms may change the batch), ``eval_fn`` under
    ``torch.no_grad()``, ``EVAL_AFTER_FORWARD`` (``outputs`` holds the batch's metrics, which
    the algorithms may change) and ``EVAL_BATCH_END``, then ``EVAL_END`` and
    ``EVAL_AFTER_ALL``. The state the events return is the state training continues from (an
    algorithm that swaps weights in on ``EVAL_START`` must swap them back on ``EVAL_END``, as in
    Composer). ``eval_fn`` must evaluate the model in eval mode, e.g. on a
    ``sbfunc.per_sample_loss(..., train=False)``.

    Args:
        step: the training step (its algorithms and passes).
        state: the state to evaluate.
        data: an iterable of evaluation batches.
        eval_fn: ``eval_fn(params, buffers, batch) -> metrics``, a pytree of per-batch means.

    Returns:
        ``(state, metrics)``: the metrics averaged over every row (batch means weighted by the
        batch sizes), on the device.

    Raises:
        ValueError: if ``data`` yields no batch.

    Example:
        >>> model = torch.nn.Linear(2, 2)
        >>> loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy)
        >>> step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1))
        >>> state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))
        >>> data = [(torch.zeros(3, 2), torch.zeros(3, dtype=torch.long)),
        ...         (torch.zeros(1, 2), torch.ones(1, dtype=torch.long))]
        >>> def accuracy(params, buffers, batch):
        ...     return {"acc": (torch.ones(len(batch[1])) * (batch[1] == 0)).mean()}
        >>> sbfunc.step.evaluate(step, state, data, accuracy)[1]
        {'acc': tensor(0.7500)}

    References:
        MosaicML Composer ``Trainer._eval_loop`` and its ``EVAL_*`` events.
    """
    state, _ = step.fire(Event.EVAL_BEFORE_ALL, state)
    state, _ = step.fire(Event.EVAL_START, state)
    total: Any = None
    rows = 0
    for i, batch in enumerate(data):
        state, batch, _ = _fire_on_batch(step, Event.EVAL_BATCH_START, state, batch, None, i)
        state, batch, _ = _fire_on_batch(step, Event.EVAL_BEFORE_FORWARD, state, batch, None, i)
        with torch.no_grad():
            metrics = eval_fn(state.params, state.buffers, batch)
        state, batch, metrics = _fire_on_batch(
            step, Event.EVAL_AFTER_FORWARD, state, batch, metrics, i
        )
        state, batch, _ = _fire_on_batch(step, Event.EVAL_BATCH_END, state, batch, metrics, i)
        n = batch_size(batch)
        total, rows = _weighted_add(total, metrics, n), rows + n
    if rows == 0:
        raise ValueError("eval_data yielded no batches (or only empty ones)")
    state, _ = step.fire(Event.EVAL_END, state)
    state, _ = step.fire(Event.EVAL_AFTER_ALL, state)
    return state, optree.tree_map(lambda m: m / rows, total)
