"""Sequence-length warm-up: train on truncated sequences first, full ones later.

The batch transform :func:`set_batch_sequence_length` is pure; :class:`SeqLengthWarmup`
decides the length on the host (``match``, from ``state.time``) and applies it on
``AFTER_DATALOADER``. The length must be fixed before Selective Backprop scores the batch, so
that the scores rank the rows that will be trained on: the default ordering rule
(:func:`sbfunc.engine.order_by_phase`) runs sequence-length changes first.
"""

from __future__ import annotations

from typing import Any

import optree
import torch

from sbfunc.batch import Field, extract
from sbfunc.engine import Algorithm, Context, Event
from sbfunc.validation import check_bool, check_int, check_real

__all__ = [
    "SeqLengthWarmup",
    "batch_sequence_length",
    "set_batch_sequence_length",
    "warmup_sequence_length",
]


def _leaves(batch: Any) -> list[Any]:
    return optree.tree_leaves(batch, none_is_leaf=True)


def _sequences(batch: Any) -> list[torch.Tensor]:
    return [x for x in _leaves(batch) if isinstance(x, torch.Tensor) and x.dim() >= 2]


def batch_sequence_length(batch: Any) -> int | None:
    """The sequence length of a batch: ``shape[1]`` of its first tensor of rank >= 2.

    Returns ``None`` when the batch has no such tensor (a host value: shapes never sync).

    Example:
        >>> batch_sequence_length({"input_ids": torch.zeros(2, 7), "label": torch.zeros(2)})
        7
    """
    sequences = _sequences(batch)
    return int(sequences[0].shape[1]) if sequences else None


def _truncate(batch: Any, length: int, mask: torch.Tensor | None) -> Any:
    if mask is None:
        return optree.tree_map(
            lambda x: x[:, :length] if isinstance(x, torch.Tensor) and x.dim() >= 2 else x,
            batch,
            none_is_leaf=True,
        )
    rows = torch.arange(mask.shape[0], device=mask.device)
    last = mask.sum(dim=1).long() - 1
    moved = last.clamp(max=length - 1)

    def cut(x: Any) -> Any:
        if not isinstance(x, torch.Tensor) or x.dim() < 2:
            return x
        return x[:, :length].index_put((rows, moved), x[rows, last])

    return optree.tree_map(cut, batch, none_is_leaf=True)


def _reshape(batch: Any, length: int) -> Any:
    sequences = _sequences(batch)
    shape = sequences[0].shape
    for x in _leaves(batch):
        if isinstance(x, torch.Tensor) and x.shape != shape:
            raise ValueError(
                f"truncate=False reshapes every tensor into rows of {length} tokens, so all "
                f"must have the shape of the first sequence, {tuple(shape)}; got "
                f"{tuple(x.shape)}"
            )
    kept = (shape.numel() // length) * length
    return optree.tree_map(
        lambda x: x.reshape(-1)[:kept].view(-1, length) if isinstance(x, torch.Tensor) else x,
        batch,
        none_is_leaf=True,
    )


def set_batch_sequence_length(
    batch: Any,
    length: int,
    *,
    truncate: bool = True,
    preserve_end_of_sequence: bool = False,
    attention_mask: Field = "attention_mask",
) -> Any:
    """The batch with sequences of ``length`` tokens: truncated, or cut into more rows.

    The batch is any pytree; its sequences are its tensors of rank >= 2 (dimension 1 is the
    sequence) and its length is :func:`batch_sequence_length`. When ``length`` is not shorter,
    the batch is returned as it is. With ``truncate`` every sequence keeps its first
    ``length`` tokens (rank-1 leaves, e.g. class labels, are left alone); with
    ``preserve_end_of_sequence`` too, each row's last real token (position
    ``attention_mask.sum(1) - 1``) is moved into the last kept position when it was cut off.
    Without ``truncate`` every tensor (all must share one shape) is flattened and cut into
    rows of ``length`` tokens, dropping the remainder: more rows, the same tokens.

    Args:
        batch: the batch (not changed).
        length: the new sequence length, ``>= 1``.
        truncate: truncate (``True``) or reshape (``False``).
        preserve_end_of_sequence: keep each row's end-of-sequence token (truncation only).
        attention_mask: where the ``[N, L]`` attention mask sits (for
            ``preserve_end_of_sequence``).

    Returns:
        The new batch.

    Raises:
        ValueError: for ``length < 1``, or tensors of different shapes with
            ``truncate=False``.
        KeyError, IndexError: if ``attention_mask`` is not in the batch (when needed).

    Example:
        >>> from sbfunc.algorithms import set_batch_sequence_length
        >>> batch = {"input_ids": torch.arange(6).view(1, 6),
        ...          "attention_mask": torch.ones(1, 6, dtype=torch.long)}
        >>> set_batch_sequence_length(batch, 3)["input_ids"]
        tensor([[0, 1, 2]])
        >>> set_batch_sequence_length(batch, 3, preserve_end_of_sequence=True)["input_ids"]
        tensor([[0, 1, 5]])
        >>> set_batch_sequence_length(batch, 3, truncate=False)["input_ids"]
        tensor([[0, 1, 2],
                [3, 4, 5]])

    References:
        Li et al. 2022, "The Stability-Efficiency Dilemma: Investigating Sequence Length
        Warmup for Training GPT Models"; MosaicML Composer ``set_batch_sequence_length``.
    """
    length = check_int(length, "length", low=1)
    current = batch_sequence_length(batch)
    if current is None or length >= current:
        return batch
    if not truncate:
        return _reshape(batch, length)
    mask = extract(batch, attention_mask, "attention_mask") if preserve_end_of_sequence else None
    return _truncate(batch, length, mask)


def warmup_sequence_length(
    elapsed: float, *, duration: float, min_seq_length: int, max_seq_length: int, step_size: int
) -> int:
    """The warm-up's sequence length after a fraction ``elapsed`` of training.

    ``min + step_size * floor(elapsed / duration * ((max - min) // step_size))``, capped at
    ``max``: it grows by ``step_size`` in equal stages over the first ``duration`` of
    training (Composer's schedule, counted in fractions of training instead of batches).

    Example:
        >>> [warmup_sequence_length(t / 4, duration=0.5, min_seq_length=8, max_seq_length=24,
        ...                         step_size=8) for t in range(4)]
        [8, 16, 24, 24]

    References:
        MosaicML Composer ``SeqLengthWarmup``.
    """
    if duration <= 0 or elapsed >= duration:
        return max_seq_length
    stages = (max_seq_length - min_seq_length) // step_size
    length = min_seq_length + step_size * int(elapsed / duration * stages)
    return min(max(length, min_seq_length), max_seq_length)


class SeqLengthWarmup(Algorithm):
    """Warm the sequence length up from ``min_seq_length`` to ``max_seq_length`` on
    ``AFTER_DATALOADER``.

    ``match`` computes the length from ``state.time.elapsed``
    (:func:`warmup_sequence_length`) and the batch's shape, on the host, and returns it when
    the batch is longer (so, like Composer, batches longer than ``max_seq_length`` are cut to
    it after the warm-up); ``apply`` calls :func:`set_batch_sequence_length` with it. Shapes
    change with the length, so a compiled step compiles one graph per length (at most
    ``(max - min) // step_size + 1``). The default passes run it before Selective Backprop
    scores the batch (``changes_sequence_length``). Composer also runs a dummy
    forward/backward at full length on ``INIT`` to reserve memory; sbfunc does not.

    Args:
        duration: fraction of training the warm-up lasts, in ``[0, 1]``.
        min_seq_length: the first length, ``>= 1``.
        max_seq_length: the final length, ``>= min_seq_length``.
        step_size: the length grows by multiples of it, ``>= 1``.
        truncate: see :func:`set_batch_sequence_length`.
        preserve_end_of_sequence: see :func:`set_batch_sequence_length`.
        attention_mask: see :func:`set_batch_sequence_length`.

    Example:
        >>> from sbfunc.algorithms import SeqLengthWarmup
        >>> warmup = SeqLengthWarmup(duration=0.5, min_seq_length=2, max_seq_length=8,
        ...                          step_size=2)
        >>> batch = {"input_ids": torch.zeros(4, 8, dtype=torch.long)}
        >>> time = sbfunc.Time(elapsed=0.2)
        >>> ctx = sbfunc.Context(sbfunc.random.key(0), batch=batch, time=time)
        >>> length = warmup.match(sbfunc.Event.AFTER_DATALOADER, ctx); length
        4
        >>> ctx = ctx.replace(matched=length)
        >>> warmup.apply(sbfunc.Event.AFTER_DATALOADER, ctx).batch["input_ids"].shape
        torch.Size([4, 4])

    References:
        Li et al. 2022; MosaicML Composer ``SeqLengthWarmup``.
    """

    uses_key = False  # deterministic: the engine derives no key for it

    changes_sequence_length = True
    """Read by :func:`sbfunc.engine.order_by_phase` (the first phase)."""

    def __init__(
        self,
        duration: float = 0.3,
        min_seq_length: int = 8,
        max_seq_length: int = 1024,
        step_size: int = 8,
        truncate: bool = True,
        preserve_end_of_sequence: bool = False,
        *,
        attention_mask: Field = "attention_mask",
    ) -> None:
        self.duration = check_real(duration, "duration", low=0.0, high=1.0)
        self.min_seq_length = check_int(min_seq_length, "min_seq_length", low=1)
        self.max_seq_length = check_int(max_seq_length, "max_seq_length", low=min_seq_length)
        self.step_size = check_int(step_size, "step_size", low=1)
        self.truncate = check_bool(truncate, "truncate")
        self.preserve = check_bool(preserve_end_of_sequence, "preserve_end_of_sequence")
        self.attention_mask = attention_mask

    def length(self, elapsed: float) -> int:
        """The target length after a fraction ``elapsed`` of training."""
        return warmup_sequence_length(
            elapsed,
            duration=self.duration,
            min_seq_length=self.min_seq_length,
            max_seq_length=self.max_seq_length,
            step_size=self.step_size,
        )

    events = frozenset({Event.AFTER_DATALOADER})
    uses_elapsed = True

    def match(self, event: Event, ctx: Context) -> int | bool:
        return self.length(ctx.time.elapsed) if event == Event.AFTER_DATALOADER else False

    def apply(self, event: Event, ctx: Context) -> Context:
        length = ctx.matched
        if isinstance(length, bool) or not isinstance(length, int):  # applied without match
            length = self.length(ctx.time.elapsed)
        current = batch_sequence_length(ctx.batch)  # a shape: static in a compiled step
        if current is None or length >= current:
            return ctx
        batch = set_batch_sequence_length(
            ctx.batch,
            length,
            truncate=self.truncate,
            preserve_end_of_sequence=self.preserve,
            attention_mask=self.attention_mask,
        )
        return ctx.replace(batch=batch)

    def __repr__(self) -> str:
        return (
            f"SeqLengthWarmup(duration={self.duration}, min_seq_length={self.min_seq_length}, "
            f"max_seq_length={self.max_seq_length}, step_size={self.step_size}, "
            f"truncate={self.truncate})"
        )
