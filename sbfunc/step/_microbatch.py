"""Microbatching (gradient accumulation) inside the training step, after sample selection.

With ``make_train_step(..., microbatching=Microbatching(chunks=k))`` (or ``size=m``) the
step fires ``AFTER_DATALOADER`` ... ``BEFORE_FORWARD`` once, on the whole batch, so Selective
Backprop
selects from every row first; only then are the **kept** rows split into contiguous chunks
(the issue with Composer, whose microbatches are cut from the loader's batch size, is that a
batch shrunk by selection under-fills them). Each chunk runs the forward, ``AFTER_FORWARD``,
``BEFORE_LOSS``, its per-sample losses and their gradient, then ``AFTER_LOSS`` and
``BEFORE_BACKWARD``, as Composer fires those per microbatch; each chunk's gradient is scaled by
its share of the rows, so the sum equals the gradient of the whole batch's weighted mean
exactly (``sum_i w_i * loss_i / N``; equal up to float rounding). ``AFTER_BACKWARD`` and
everything after it fire once, on the whole kept batch, with the accumulated gradient, the
whole batch's loss, the per-sample losses of every chunk concatenated, and the model outputs
concatenated when they are plain tensors (``None`` for structured outputs). The one exception
is a token selection (``Algorithm.selects_tokens``): it ranks the whole batch's real tokens
once, from a forward of every chunk without gradients, and each chunk then trains on its kept
tokens (:func:`select_whole_batch`), so the update never depends on the split.

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
from sbfunc.engine import Context, Event
from sbfunc.engine.internal import Carry
from sbfunc.step._objective import Differentiated, Fire, Objective
from sbfunc.step._records import Gradients
from sbfunc.types import Params, PerSample

__all__ = ["Microbatching", "accumulate", "check_microbatching"]

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


def check_microbatching(split: Microbatching) -> Microbatching:
    """Validate a :class:`Microbatching` (``make_train_step``'s ``microbatching=``) and return
    it.

    Raises:
        ValueError: unless exactly one field is set, to an int >= 1.
        TypeError: for a field that is not an int.

    Example:
        >>> check_microbatching(Microbatching(chunks=2))
        Microbatching(chunks=2, size=None)
        >>> check_microbatching(Microbatching(chunks=2, size=8))
        Traceback (most recent call last):
        ...
        ValueError: Microbatching takes exactly one of chunks and size, got chunks=2, size=8
    """
    if (split.chunks is None) == (split.size is None):
        raise ValueError(
            "Microbatching takes exactly one of chunks and size, got "
            f"chunks={split.chunks!r}, size={split.size!r}"
        )
    for name, value in (("chunks", split.chunks), ("size", split.size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"Microbatching.{name} must be an int >= 1, got {value!r}")
        if value is not None and value < 1:
            raise ValueError(f"Microbatching.{name} must be an int >= 1, got {value!r}")
    return split


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
    whole: tuple[Fire, Fire] | None = None,
) -> Gradients:
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
        whole: with token selections (``Algorithm.selects_tokens``) planned on
            ``AFTER_LOSS``/``BEFORE_BACKWARD``, ``(fire without them, fire with them alone)``:
            split into chunks, they fire once on the whole batch's token losses
            (:func:`select_whole_batch`) and the chunks fire the rest; ``None``: none.

    Returns:
        The :class:`~sbfunc.step._records.Gradients`: the carry with the whole kept batch and
        weights back, the concatenated per-sample losses (and outputs) and the last chunk's
        buffers; the accumulated gradient (scaled as the loss); the whole batch's weighted
        mean loss (chunks combine by their share of the rows, or of the token weight under a
        token objective); the rows the loss used (``None`` when not masking); the number of
        rows backpropagated; the tokens the loss averaged.
    """
    batch, weights = carry.context.batch, carry.context.sample_weights
    rows = batch_size(batch, per_sample=per_sample)
    sizes = () if split is None else split.sizes(rows)

    def key_of(c: Carry) -> torch.Tensor | None:
        return None if model_key is None or c.step_key is None else model_key(c.step_key)

    def run(c: Carry, part: torch.Tensor | None, decided: torch.Tensor | None) -> Differentiated:
        return objective(c, fire, inside=inside, model_key=key_of(c), ok=part, scale=scale,
                         token_weights=decided)  # fmt: skip

    if len(sizes) <= 1:  # one chunk: exactly the unsplit step
        d = run(carry, ok, None)
        rows = batch_size(d.carry.context.batch, per_sample=per_sample)
        return Gradients(d.carry, d.grads, d.loss, d.used, rows, d.tokens)
    decided = None
    parts = _parts(carry, sizes, ok, per_sample)
    if whole is not None:
        fire, selections = whole
        scores = []
        for p in parts:
            c = p.carry(carry)
            scores.append(objective.token_scores(c, fire, model_key=key_of(c), ok=p.ok))
        carry, decided = select_whole_batch(carry, selections, scores)
    acc, start, base_key = _Accumulated(), 0, carry.step_key
    for p in parts:
        n = p.rows
        chosen = None if decided is None else decided[start : start + n]
        d = run(p.carry(carry), p.ok, chosen)
        carry, acc = d.carry, acc.add(d, n / rows)
        start += n
    ctx = acc.context(carry.context._replace(batch=batch, sample_weights=weights))
    grads, loss, used = acc.results()
    carry = carry._replace(context=ctx, step_key=base_key)
    return Gradients(carry, grads, loss, used, rows, acc.tokens)


class _Part(NamedTuple):
    """One chunk: its rows, their weights and ``ok`` mask, its step key."""

    batch: Any
    weights: torch.Tensor | None
    ok: torch.Tensor | None
    key: torch.Tensor | None
    rows: int

    def carry(self, running: Carry) -> Carry:
        """The chunk's carry from the running one (its parameters, buffers and states): its
        rows, weights and key, no outputs or losses yet."""
        ctx = running.context._replace(
            batch=self.batch, sample_weights=self.weights, outputs=None, loss=None, losses=None
        )
        return running._replace(context=ctx, step_key=self.key)


def _parts(
    carry: Carry, sizes: tuple[int, ...], ok: torch.Tensor | None, per_sample: PerSample
) -> list[_Part]:
    """The chunks of the carried batch, contiguous rows of ``sizes``; chunk 0 keeps the step's
    key, the others fold in their index."""
    ctx = carry.context
    batch, weights, base = ctx.batch, ctx.sample_weights, carry.step_key
    device = next(iter(ctx.params.values())).device if ctx.params else None
    out, start = [], 0
    for c, n in enumerate(sizes):
        rows = take(batch, torch.arange(start, start + n, device=device), per_sample=per_sample)
        out.append(_Part(
            rows,
            None if weights is None else weights[start : start + n],
            None if ok is None else ok[start : start + n],
            base if base is None or c == 0 else sbrandom.fold_in(base, _CHUNK_STREAM + c),
            n,
        ))  # fmt: skip
        start += n
    return out


def select_whole_batch(
    carry: Carry, whole: Fire, scores: list[tuple[torch.Tensor | None, torch.Tensor | None]]
) -> tuple[Carry, torch.Tensor | None]:
    """Fire the token selections ``whole`` once, on ``AFTER_LOSS`` and ``BEFORE_BACKWARD``,
    with the whole batch's token losses and weights (the chunks' ``scores``, from a no-grad
    pass): ``(carry, token weights)``, the carry with their states and traces. So a
    microbatched step selects over the whole batch's real tokens, as the unsplit step does,
    whatever the split (one more forward of every chunk, without gradients).

    Raises:
        ValueError: if a selection changes ``loss``, ``losses`` or ``token_losses`` (they come
            from a pass without gradients: only weights can be decided there).
    """
    losses = [s[0] for s in scores]
    weights = [s[1] for s in scores]
    tokens = None if any(t is None for t in losses) else torch.cat(losses)  # type: ignore[arg-type]
    real = None if any(w is None for w in weights) else torch.cat(weights)  # type: ignore[arg-type]
    ctx = carry.context._replace(token_losses=tokens, token_weights=real)
    out = whole(Event.BEFORE_BACKWARD, whole(Event.AFTER_LOSS, carry._replace(context=ctx)))
    new = out.context
    changed = [
        name
        for name in ("loss", "losses", "token_losses")
        if getattr(new, name) is not getattr(ctx, name)
    ]
    if changed:
        raise ValueError(
            f"a token selection changed ctx.{', ctx.'.join(changed)} in a microbatched step, "
            "where it decides on the whole batch from a pass without gradients: it may change "
            "only the weights (ctx.token_weights, ctx.sample_weights)"
        )
    return out._replace(
        context=new._replace(token_losses=None, token_weights=None)
    ), new.token_weights


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
    tokens: torch.Tensor | None = None

    def add(self, d: Differentiated, rows_share: float) -> _Accumulated:
        ctx, loss, grads = d.carry.context, d.loss, d.grads
        share: float | torch.Tensor = rows_share
        if d.weight is not None:  # a chunk without token weight adds nothing (not its NaN)
            share = d.weight
            loss = torch.where(d.weight > 0, loss, loss.new_zeros(()))
            grads = {k: torch.where(d.weight > 0, g, g.new_zeros(())) for k, g in grads.items()}
        total = None if d.weight is None else d.weight + (0 if self.total is None else self.total)
        tokens = _added(self.tokens, d.tokens)
        return _Accumulated(
            _scaled_sum(self.grads, grads, share),
            loss * share if self.loss is None else self.loss + loss * share,
            (*self.losses, ctx.losses if ctx.losses is not None else loss.new_zeros(0)),
            (*self.outputs, ctx.outputs),
            self.masks if d.used is None else (*self.masks, d.used),
            total,
            tokens,
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


def _added(total: torch.Tensor | None, part: torch.Tensor | None) -> torch.Tensor | None:
    return part if total is None else total if part is None else total + part
