"""The records of a step: its per-batch events, its plan and what it reports."""

from __future__ import annotations

import struct
from typing import NamedTuple

import torch

from sbfunc.engine import Event, Time, Trace
from sbfunc.engine.internal import Carry, Plan
from sbfunc.select import Selection
from sbfunc.types import Params

__all__ = ["BATCH_EVENTS", "Clock", "CoreOutputs", "Gradients", "StepMetrics", "StepPlan"]

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


class Clock(NamedTuple):
    """The step-start :class:`~sbfunc.Time` packed into one ``int64`` tensor: one
    host-to-device copy a step, where :meth:`Time.as_tensors` makes two, and one input of the
    compiled core instead of eight. :meth:`time` unpacks it, inside the core, into the same
    0-d tensors :meth:`Time.as_tensors` makes (bit for bit: ``elapsed`` travels as its
    float64 bits and is rounded to float32 as ``torch.tensor(elapsed, dtype=float32)`` does).

    Attributes:
        values: ``int64 Tensor[7]``: ``step``, ``epoch``, ``batch_in_epoch``,
            ``samples_forwarded``, ``samples_backpropagated``, ``total_steps`` (``-1`` while
            unknown) and the float64 bits of ``elapsed``.
        total_known: whether ``total_steps`` is known (a host value: the core's structure).

    Example:
        >>> t = sbfunc.Time(step=7, elapsed=0.1, total_steps=70)
        >>> Clock.of(t, "cpu").time(t) == t.as_tensors()
        True
    """

    values: torch.Tensor
    total_known: bool

    @staticmethod
    def of(time: Time, device: torch.device | str | None) -> Clock:
        """``time``'s host numbers packed on ``device``."""
        known = time.total_steps is not None
        bits = struct.unpack("<q", struct.pack("<d", float(time.elapsed)))[0]
        total = time.total_steps if known else -1
        counts = (time.step, time.epoch, time.batch_in_epoch, time.samples_forwarded,
                  time.samples_backpropagated, total, bits)  # fmt: skip
        return Clock(torch.tensor(counts, dtype=torch.int64, device=device), known)

    def time(self, host: Time) -> Time:
        """The :class:`~sbfunc.Time` of 0-d tensors ``apply`` reads, with ``host``'s device
        counters (``updates_skipped``, ``rows_nonfinite``; zeros where ``None``)."""
        v = self.values.unbind()
        zero = v[0].new_zeros(())
        skipped, bad = host.updates_skipped, host.rows_nonfinite
        return Time(
            v[0],
            v[1],
            v[2],
            v[6].view(torch.float64).to(torch.float32),
            v[3],
            v[4],
            zero if skipped is None else skipped,
            v[5] if self.total_known else None,
            zero if bad is None else bad,
        )


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
