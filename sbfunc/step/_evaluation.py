"""Evaluation inside :func:`sbfunc.fit`: Composer's ``EVAL_*`` events around a pure metric
function, and the record of one evaluation."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import optree
import torch

from sbfunc import random as sbrandom
from sbfunc.batch import batch_size
from sbfunc.engine import EVALUATION, Context, Event, TrainState
from sbfunc.engine.internal import Carry, apply_planned

if TYPE_CHECKING:
    from sbfunc.step._train_step import TrainStep

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
            metrics weighted by its number of rows): tensors left on the device from
            :func:`evaluate`, Python numbers (one host read per evaluation) from
            :func:`sbfunc.fit`.

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
    planner = step.all_events
    planned = planner.decide_event(event, state.time, state.algorithm_state)
    if not planned:
        return state, batch, outputs
    time = state.time.as_tensors(state.key.device)
    base = sbrandom.fold_in(sbrandom.fold_in(state.key, time.step), _EVAL_STREAM + index)
    context = Context(
        None,  # type: ignore[arg-type]
        state.params,
        state.buffers,
        state.opt_state,
        time,
        batch=batch,
        outputs=outputs,
    )
    carry = Carry.start(state, context, len(planner.leaves))._replace(step_key=base)
    carry = apply_planned(event, planned, carry, planner.leaves, state.key, writes=EVALUATION)
    out = carry.context
    new = TrainState(
        out.params, out.buffers, state.key, out.opt_state, carry.algorithm_state, state.time
    )
    return new, out.batch, out.outputs


def _weighted_add(total: Any, metrics: Any, rows: int) -> Any:
    def scale(m: Any) -> Any:
        return m.detach() * rows if isinstance(m, torch.Tensor) else m * rows

    scaled = optree.tree_map(scale, metrics)
    if total is None:
        return scaled
    return optree.tree_map(lambda a, b: a + b, total, scaled)


def _evaluate_one(
    step: TrainStep, state: TrainState, data: Iterable[Any], eval_fn: EvalFn, name: str | None
) -> tuple[TrainState, Any]:
    state, _ = step.run_event(Event.EVAL_START, state)
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
        where = "eval_data" if name is None else f"eval_data[{name!r}]"
        raise ValueError(f"{where} yielded no batches (or only empty ones)")
    state, _ = step.run_event(Event.EVAL_END, state)
    return state, optree.tree_map(lambda m: m / rows, total)


def evaluate(
    step: TrainStep,
    state: TrainState,
    data: Iterable[Any] | Mapping[str, Iterable[Any]],
    eval_fn: EvalFn,
) -> tuple[TrainState, Any]:
    """Evaluate ``state`` on one or several evaluation sets, firing the evaluation events with
    ``step``'s algorithms.

    Fires ``EVAL_BEFORE_ALL``; then per evaluation set (Composer's evaluators) ``EVAL_START``,
    per batch ``EVAL_BATCH_START``, ``EVAL_BEFORE_FORWARD`` (the algorithms may change the
    batch), ``eval_fn`` under ``torch.no_grad()``, ``EVAL_AFTER_FORWARD`` (``outputs`` holds the
    batch's metrics, which the algorithms may change) and ``EVAL_BATCH_END``, then
    ``EVAL_END``; finally ``EVAL_AFTER_ALL``. The state the events return is the state training
    continues from (an algorithm that swaps weights in on ``EVAL_START`` must swap them back on
    ``EVAL_END``, as in Composer). ``eval_fn`` must not write the buffers: build it on
    :func:`sbfunc.per_sample_loss` (which evaluates in eval mode when called directly).

    Args:
        step: the training step (its algorithms and their order).
        state: the state to evaluate.
        data: an iterable of evaluation batches, or a mapping ``name -> iterable`` of several
            evaluation sets.
        eval_fn: ``eval_fn(params, buffers, batch) -> metrics``, a pytree of per-batch means.

    Returns:
        ``(state, metrics)``: the metrics averaged over every row (batch means weighted by the
        batch sizes), on the device; with a mapping, a dict of them by name.

    Raises:
        ValueError: if an evaluation set yields no batch, or the mapping is empty.

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
        >>> sbfunc.step.evaluate(step, state, {"a": data, "b": data[1:]}, accuracy)[1]
        {'a': {'acc': tensor(0.7500)}, 'b': {'acc': tensor(0.)}}

    References:
        MosaicML Composer ``Trainer._eval_loop``, ``Evaluator`` and the ``EVAL_*`` events.
    """
    several = isinstance(data, Mapping)
    sets: dict[str | None, Iterable[Any]] = {}
    if isinstance(data, Mapping):
        sets.update(data)
    else:
        sets[None] = data
    if not sets:
        raise ValueError("eval_data is an empty mapping; give at least one evaluation set")
    state, _ = step.run_event(Event.EVAL_BEFORE_ALL, state)
    results: dict[str | None, Any] = {}
    for name, batches in sets.items():
        state, results[name] = _evaluate_one(step, state, batches, eval_fn, name)
    state, _ = step.run_event(Event.EVAL_AFTER_ALL, state)
    return state, results if several else results[None]
