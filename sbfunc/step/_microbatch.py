"""Microbatching (gradient accumulation) inside the training step, after sample selection.

With ``make_train_step(..., microbatches=k)`` or ``microbatch_size=m`` the step still fires
``AFTER_DATALOADER`` ... ``BEFORE_FORWARD`` once, on the whole batch, so Selective Backprop
selects from every row first; only then are the **kept** rows split into contiguous chunks
(the issue with Composer, whose microbatches are cut from the loader's batch size, is that a
batch shrunk by selection under-fills them). Each chunk runs the forward, ``AFTER_FORWARD``,
``BEFORE_LOSS``, its per-sample losses and their gradient, then ``AFTER_LOSS`` and
``BEFORE_BACKWARD``, as Composer fires those per microbatch; each chunk's gradient is scaled by
its share of the rows, so the sum equals the gradient of the whole batch's weighted mean
exactly (``sum_i w_i * loss_i / N``; equal up to float rounding). ``AFTER_BACKWARD`` and
everything after it fire once, on the whole kept batch, with the accumulated gradient, the
whole batch's loss, the per-sample losses of every chunk concatenated, and the model outputs
concatenated when they are plain tensors (``None`` for structured outputs).

BatchNorm layers see each chunk as a batch: their statistics are the chunk's, and their
running statistics are updated chunk by chunk (as in any gradient-accumulation loop), so a
model with BatchNorm trains differently from the unsplit step; without it the two agree.
Chunk shapes depend only on the number of kept rows, a host value, so a compiled step keeps
static shapes (one graph per kept count, as without microbatching).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from sbfunc import random as sbrandom
from sbfunc.batch import batch_size, take
from sbfunc.engine import Carry, Context
from sbfunc.step._objective import Differentiated, Fire, Objective
from sbfunc.types import Params, PerSample

__all__ = ["Microbatching", "accumulate", "microbatching"]

_CHUNK_STREAM = zlib.crc32(b"sbfunc.microbatch") | (1 << 42)  # never another stream id


class Microbatching(NamedTuple):
    """How the kept rows of a batch split into microbatches (exactly one field is set).

    Attributes:
        chunks: split into this many chunks of near-equal size (the first ones one row larger
            when the count does not divide the rows; fewer chunks when there are fewer rows).
        size: split into chunks of this many rows, the last one smaller (Composer's
            ``device_train_microbatch_size``).

    Example:
        >>> Microbatching(chunks=3).sizes(8), Microbatching(size=3).sizes(8)
        ((3, 3, 2), (3, 3, 2))
        >>> Microbatching(chunks=4).sizes(6), Microbatching(size=4).sizes(6)
        ((2, 2, 1, 1), (4, 2))

    References:
        MosaicML Composer ``device_train_microbatch_size``; ``torch.tensor_split`` (the near-
        equal split).
    """

    chunks: int | None = None
    size: int | None = None

    def sizes(self, rows: int) -> tuple[int, ...]:
        """The chunk sizes for ``rows`` kept rows (empty for zero rows)."""
        if rows <= 0:
            return ()
        if self.chunks is not None:
            k = min(self.chunks, rows)
            q, r = divmod(rows, k)
            return (q + 1,) * r + (q,) * (k - r)
        assert self.size is not None
        q, r = divmod(rows, self.size)
        return (self.size,) * q + ((r,) if r else ())


def microbatching(microbatches: int | None, microbatch_size: int | None) -> Microbatching | None:
    """Validate ``make_train_step``'s microbatching arguments.

    Returns:
        ``None`` when neither is given (no microbatching), else a :class:`Microbatching`.

    Raises:
        ValueError: if both are given, or one is not an int >= 1.

    Example:
        >>> microbatching(None, None) is None, microbatching(2, None)
        (True, Microbatching(chunks=2, size=None))
    """
    if microbatches is not None and microbatch_size is not None:
        raise ValueError(
            "give at most one of microbatches and microbatch_size, got "
            f"microbatches={microbatches!r}, microbatch_size={microbatch_size!r}"
        )
    for name, value in (("microbatches", microbatches), ("microbatch_size", microbatch_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"{name} must be an int >= 1 or None, got {value!r}")
        if value is not None and value < 1:
            raise ValueError(f"{name} must be an int >= 1 or None, got {value!r}")
    if microbatches is None and microbatch_size is None:
        return None
    return Microbatching(microbatches, microbatch_size)


def _scaled_sum(total: Params | None, grads: Params, scale: float | torch.Tensor) -> Params:
    if total is None:
        return {k: g * scale for k, g in grads.items()}
    return {k: total[k] + g * scale for k, g in grads.items()}


def _joined(outputs: list[object]) -> torch.Tensor | None:
    """The chunks' model outputs as one tensor when each is a tensor over its rows, else
    ``None`` (the outputs of a structured model are not joined)."""
    tensors = [o for o in outputs if isinstance(o, torch.Tensor) and o.dim() > 0]
    return torch.cat(tensors) if len(tensors) == len(outputs) else None


def accumulate(
    objective: Objective,
    fire: Fire,
    carry: Carry,
    split: Microbatching | None,
    *,
    per_sample: PerSample,
    inside: bool,
    model_key: Callable[[torch.Tensor], torch.Tensor] | None,
    ok: torch.Tensor | None,
    scale: torch.Tensor | None = None,
) -> tuple[Carry, Params, torch.Tensor, torch.Tensor | None, int]:
    """Forward, loss and gradient of the carried batch, chunk by chunk when ``split`` says so
    (see the module docs); fires ``AFTER_FORWARD`` ... ``BEFORE_BACKWARD`` per chunk.

    Args:
        objective: the step's :class:`~sbfunc.step._objective.Objective`.
        fire: applies one event's planned algorithms to a carry.
        carry: the carry after ``BEFORE_FORWARD``.
        split: how to split the kept rows (``None``: one chunk).
        per_sample: the batch's per-sample spec.
        inside: whether algorithms run on ``AFTER_FORWARD``/``BEFORE_LOSS``.
        model_key: the step key -> the key of the model's randomness, or ``None`` (no
            randomness in the model).
        ok: the rows whose inputs are finite, or ``None``.
        scale: the loss scale every chunk's loss is multiplied by (``None``: none).

    Returns:
        ``(carry, grads, loss, used, rows)``: the carry with the whole kept batch and weights
        back, the concatenated per-sample losses (and outputs) and the last chunk's buffers;
        the accumulated gradient (scaled as the loss); the whole batch's weighted mean loss
        (chunks combine by their share of the rows, or of the token weight under a token
        objective); the rows the loss used (``None`` when not masking); the number of rows
        backpropagated.
    """
    batch, weights = carry.context.batch, carry.context.sample_weights
    rows = batch_size(batch, per_sample=per_sample)
    sizes = () if split is None else split.sizes(rows)

    def run(c: Carry, part: torch.Tensor | None) -> Differentiated:
        key = None if model_key is None or c.step_key is None else model_key(c.step_key)
        return objective(c, fire, inside=inside, model_key=key, ok=part, scale=scale)

    if len(sizes) <= 1:  # one chunk: exactly the unsplit step
        d = run(carry, ok)
        rows = batch_size(d.carry.context.batch, per_sample=per_sample)
        return d.carry, d.grads, d.loss, d.used, rows
    params = carry.context.params
    device = params[next(iter(params))].device if params else None
    base_key, acc, start = carry.step_key, _Accumulated(), 0
    for c, n in enumerate(sizes):
        carry = _chunk(carry, take(batch, torch.arange(start, start + n, device=device),
                                   per_sample=per_sample),
                       None if weights is None else weights[start : start + n],
                       _chunk_key(base_key, c))  # fmt: skip
        d = run(carry, None if ok is None else ok[start : start + n])
        carry, acc = d.carry, acc.add(d, n / rows)
        start += n
    ctx = acc.context(carry.context._replace(batch=batch, sample_weights=weights))
    return carry._replace(context=ctx, step_key=base_key), *acc.results(), rows


def _chunk_key(base: torch.Tensor | None, c: int) -> torch.Tensor | None:
    """Chunk ``c``'s step key: chunk 0 keeps the step's keys, the others fold in their index."""
    return base if base is None or c == 0 else sbrandom.fold_in(base, _CHUNK_STREAM + c)


def _chunk(
    carry: Carry, rows: Any, weights: torch.Tensor | None, key: torch.Tensor | None
) -> Carry:
    """The carry of one chunk: its rows and weights, no outputs or losses yet."""
    ctx = carry.context._replace(
        batch=rows, sample_weights=weights, outputs=None, loss=None, losses=None
    )
    return carry._replace(context=ctx, step_key=key)


class _Accumulated(NamedTuple):
    """The chunks' sums so far: gradients and loss weighted by each chunk's share of the rows
    (or, under a token objective, by its token weight, divided by the total at the end), and
    the per-row losses, outputs and used-row masks in row order."""

    grads: Params | None = None
    loss: torch.Tensor | None = None
    losses: tuple[torch.Tensor, ...] = ()
    outputs: tuple[object, ...] = ()
    masks: tuple[torch.Tensor, ...] = ()
    total: torch.Tensor | None = None

    def add(self, d: Differentiated, rows_share: float) -> _Accumulated:
        ctx, loss, grads = d.carry.context, d.loss, d.grads
        share: float | torch.Tensor = rows_share
        if d.weight is not None:  # a chunk without token weight adds nothing (not its NaN)
            share = d.weight
            loss = torch.where(d.weight > 0, loss, loss.new_zeros(()))
            grads = {k: torch.where(d.weight > 0, g, g.new_zeros(())) for k, g in grads.items()}
        total = None if d.weight is None else d.weight + (0 if self.total is None else self.total)
        return _Accumulated(
            _scaled_sum(self.grads, grads, share),
            loss * share if self.loss is None else self.loss + loss * share,
            (*self.losses, ctx.losses if ctx.losses is not None else loss.new_zeros(0)),
            (*self.outputs, ctx.outputs),
            self.masks if d.used is None else (*self.masks, d.used),
            total,
        )

    def context(self, ctx: Context) -> Context:
        """``ctx`` with the whole batch's outputs, loss and per-row losses."""
        return ctx._replace(
            outputs=_joined(list(self.outputs)), loss=self.loss, losses=torch.cat(self.losses)
        )

    def results(self) -> tuple[Params, torch.Tensor, torch.Tensor | None]:
        """``(grads, loss, used)``: the whole batch's gradient, loss and used rows."""
        assert self.grads is not None and self.loss is not None
        used = torch.cat(self.masks) if self.masks else None
        if self.total is None:
            return self.grads, self.loss, used
        total = self.total
        return {k: g / total for k, g in self.grads.items()}, self.loss / total, used
