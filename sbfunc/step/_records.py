"""The records of a step: its per-batch events, its plan and what it reports."""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch

from sbfunc._tracing import replace_by_constructor
from sbfunc.engine import Event, Trace
from sbfunc.engine.internal import Carry, Clock, Plan
from sbfunc.select import Selection
from sbfunc.types import Params

__all__ = ["BATCH_EVENTS", "CoreOutputs", "Gradients", "NonFinite", "StepMetrics", "StepPlan"]

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

NonFinite = Literal["skip", "raise", "allow"]
"""``make_train_step``'s ``nonfinite`` values: ``"skip"`` (the default) leaves a row the step
cannot train on out of the update and keeps a non-finite update from the state, counting both;
``"raise"`` raises ``FloatingPointError`` instead (reading the flags syncs); ``"allow"``
applies every update as it is and counts nothing."""


class StepMetrics(NamedTuple):
    """What one step reports.

    Attributes:
        loss: the (weighted) mean training loss of the backpropagated rows, a 0-d tensor left
            on the device (reading it is the caller's choice of sync); NaN when no row was
            trained on.
        samples_in_batch: rows the data loader delivered.
        samples_backpropagated: the rows whose loss the update averaged (after selection).
            A row the step left out (no real target token, an empty attention mask, a
            non-finite input or loss) is not counted where reading its flag costs nothing:
            always on the CPU, eager or compiled. On an accelerator the step never syncs to
            read it: the count there includes such rows (``rows_nonfinite`` counts them on
            the device).
        skipped: a 0-d bool tensor: the update did not reach the parameters (a non-finite
            loss or gradient, or no row left to train on).
        traces: the engine's traces of every event of the step, in order.
        rows_nonfinite: a 0-d ``int64`` tensor: rows left out of the update because their
            input or loss was not finite, those a selection left out for a non-finite score
            included (``Context.rows_unscorable``); ``None`` with ``nonfinite="allow"``.
        kept: which rows of the batch a selection kept: a :class:`~sbfunc.select.Selection`
            of ``int64`` indices into the batch the step was given (sorted) and the kept rows'
            loss weights (or ``None``), left on the device; ``None`` when no selection ran
            this step. With Selective Backprop's ``refill`` queue these are the rows kept and
            queued this step (the backpropagated rows may come from earlier batches).
        tokens_backpropagated: for a loss over tokens (the ``"tokens"`` objective), the real
            tokens the update averaged, a 0-d ``int64`` tensor left on the device: the kept
            tokens under a token selection (padding, ``-100`` labels and left-out rows never
            count); ``None`` for a loss with one value per row.

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
    kept: Selection | None = None
    tokens_backpropagated: torch.Tensor | None = None


class StepPlan(NamedTuple):
    """The host decisions of one step (see :meth:`TrainStep.plan`).

    Attributes:
        events: the planned applications of every per-batch event.
        clock: the step-start time, packed (:class:`Clock`; the core unpacks it into the
            tensors ``apply`` reads), or ``None`` when no algorithm and no model randomness
            needs it.
    """

    events: Plan
    clock: Clock | None


@replace_by_constructor  # a compiled frame returns it: see replace_by_constructor
class CoreOutputs(NamedTuple):
    """What the core returns beside the carry (read by ``finish``): the step's metrics and
    the run's device counters, all counted inside the core so ``finish`` runs no tensor
    operation (``rows_nonfinite`` includes the rows a selection left out for a non-finite
    score; ``rows_nonfinite_total`` is the run's count after this step, ``None`` when the
    time keeps none; ``rows_unused`` the rows that went through the backward without a
    weight in the update, stand-ins for unusable rows included, ``None`` when every row
    counted; ``tokens`` the tokens the update averaged)."""

    loss: torch.Tensor
    samples_in_batch: int
    samples_backpropagated: int
    skipped: torch.Tensor
    updates_skipped: torch.Tensor
    rows_nonfinite: torch.Tensor | None
    rows_nonfinite_total: torch.Tensor | None = None
    rows_unused: torch.Tensor | None = None
    tokens: torch.Tensor | None = None


class Gradients(NamedTuple):
    """The differentiated part of a step, whole or accumulated over microbatches.

    Attributes:
        carry: the carry after ``BEFORE_BACKWARD``, with the whole kept batch.
        grads: the gradients of the loss (scaled as the loss).
        loss: the loss, the mean the step differentiated.
        used: the rows the loss used (inputs and loss finite), ``None`` when every row did.
        rows: the rows that went through the backward (a host count).
        tokens: the tokens the loss averaged (0-d ``int64``), ``None`` for a mean over rows.
    """

    carry: Carry
    grads: Params
    loss: torch.Tensor
    used: torch.Tensor | None
    rows: int
    tokens: torch.Tensor | None = None
