"""The records of a step: its per-batch events, its plan and what it reports."""

from __future__ import annotations

from typing import NamedTuple

import torch

from sbfunc.engine import Event, Time, Trace
from sbfunc.engine.plan import Plan

__all__ = ["BATCH_EVENTS", "CoreOutputs", "StepMetrics", "StepPlan"]

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
        rows_nonfinite: a 0-d ``int64`` tensor: rows left out of the update because their
            input or loss was not finite, those a selection left out for a non-finite score
            included (``Context.rows_unscorable``); ``None`` with ``nonfinite="allow"``.

    Example:
        >>> m = sbfunc.step.StepMetrics(torch.tensor(0.5), 64, 32, torch.tensor(False), ())
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
    rows_nonfinite: torch.Tensor | None = None


class StepPlan(NamedTuple):
    """The host decisions of one step (see :meth:`TrainStep.plan`).

    Attributes:
        events: the planned applications of every per-batch event.
        time: the step-start time as tensors (what ``apply`` reads), or ``None`` when no
            algorithm and no model randomness needs it.
    """

    events: Plan
    time: Time | None


class CoreOutputs(NamedTuple):
    """What the core returns beside the carry (read by ``finish``)."""

    loss: torch.Tensor
    samples_in_batch: int
    samples_backpropagated: int
    skipped: torch.Tensor
    updates_skipped: torch.Tensor
    rows_nonfinite: torch.Tensor | None
