"""Score every sample of a batch by its loss, under no-grad."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from sbfunc.batch import Field, batch_device, batch_size
from sbfunc.module import ModuleLoss, check_loss_fn, reduce_per_sample
from sbfunc.score._downsample import check_scale_factor, downsample_batch
from sbfunc.types import LossFn, Params, PerSample

__all__ = ["score_losses", "scoring_precision", "unusable_as_nan"]


def scoring_precision(
    params: Params, dtype: torch.dtype | None
) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast`` to ``dtype`` on the parameters' device (a null context for ``None``):
    the scoring forward's precision."""
    if dtype is None:
        return contextlib.nullcontext()
    device = next(iter(params.values())).device if params else torch.device("cpu")
    return torch.autocast(device.type, dtype=dtype)


def score_losses(
    loss_fn: LossFn,
    params: Params,
    buffers: Params,
    batch: Any,
    *,
    scale_factor: float = 1.0,
    input: Field = 0,
    dtype: torch.dtype | None = None,
    per_sample: PerSample = None,
    rows: int | None = None,
) -> torch.Tensor:
    """Per-sample losses of a whole batch, computed without building a graph.

    The cheap forward of Selective Backprop: ``loss_fn`` runs under ``torch.no_grad`` on the
    batch, optionally with its ``input`` field spatially downsampled by ``scale_factor`` (the
    gradient step later uses the full-size rows). Element losses ``[N, ...]`` (tokens, pixels)
    are reduced per sample by their mean.

    Whether dropout and BatchNorm run in train or eval mode is a property of ``loss_fn``: build
    it with ``sbfunc.per_sample_loss(...)`` (its default ``mode="auto"`` scores in eval mode)
    for deterministic scores
    that never touch running statistics.

    Args:
        loss_fn: a per-sample loss function ``(params, buffers, batch) -> Tensor[N]``.
        params: parameter dict.
        buffers: buffer dict.
        batch: any pytree batch.
        scale_factor: spatial scale of the scoring input, in (0, 1].
        input: where the input sits in the batch (only used when ``scale_factor != 1``).
        dtype: run the forward under ``torch.autocast`` with this dtype (e.g.
            ``torch.bfloat16``) on the batch's device; the scores come back as ``float32``.
        per_sample: which leaves of ``batch`` are per-sample (:data:`sbfunc.types.PerSample`),
            to count its rows; ``None`` infers them.
        rows: the batch's row count when the caller has counted it (then it is not counted
            again, and ``per_sample`` is not read); ``None``: counted here.

    Returns:
        A detached ``Tensor[N]`` on the batch's device; for an empty batch, an empty one
        (``loss_fn`` is not called).

    Raises:
        ValueError: for ``scale_factor`` outside (0, 1], an input of rank other than 3, 4 or 5
            when downsampling, or a loss that is not per-sample.

    Example:
        >>> model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))
        >>> loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy)
        >>> params, buffers = sbfunc.split_module(model)
        >>> batch = (torch.randn(8, 1, 4, 4), torch.randint(0, 3, (8,)))
        >>> sbfunc.score.score_losses(loss_fn, params, buffers, batch).shape
        torch.Size([8])

    References:
        Jiang et al. 2019, "Accelerating Deep Learning by Focusing on the Biggest Losers".
    """
    check_loss_fn(loss_fn)
    n = batch_size(batch, per_sample=per_sample) if rows is None else rows
    if n == 0:
        check_scale_factor(scale_factor)
        return torch.zeros(0, device=batch_device(batch))
    scored = downsample_batch(batch, scale_factor, input=input)
    with torch.no_grad(), scoring_precision(params, dtype):
        losses = reduce_per_sample(loss_fn(params, buffers, scored), n).detach()
    return unusable_as_nan(loss_fn, batch, losses if dtype is None else losses.float())


def unusable_as_nan(loss_fn: LossFn, batch: Any, losses: torch.Tensor) -> torch.Tensor:
    """``losses`` with NaN for the rows a step cannot train on (no real target token, no real
    attention position: :meth:`sbfunc.module.ModuleLoss.usable_rows`), whatever the scoring
    forward gave them (an eval-mode encoder may return finite values for an empty row): every
    policy ranks them last, and a selection counts them as unscorable."""
    usable = loss_fn.usable_rows(batch) if isinstance(loss_fn, ModuleLoss) else None
    if usable is None:
        return losses
    return torch.where(usable.to(losses.device), losses, losses.new_full((), torch.nan))
