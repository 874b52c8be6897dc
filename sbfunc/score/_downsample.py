"""Spatial downsampling of the scoring input (Composer's ``scale_factor``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from sbfunc.batch import Field, batch_size, extract, replace, take
from sbfunc.types import PerSample
from sbfunc.validation import check_fraction

__all__ = [
    "check_downsampled_scoring",
    "check_scale_factor",
    "downsample",
    "downsample_batch",
]

_MODES = {3: "linear", 4: "bilinear", 5: "trilinear"}


def check_scale_factor(scale_factor: float) -> float:
    """Validate ``scale_factor`` in (0, 1] and return it as a float.

    Example:
        >>> from sbfunc.score import check_scale_factor
        >>> check_scale_factor(0.5)
        0.5
    """
    return check_fraction(scale_factor, "scale_factor", open_low=True, fix="1 scores at full size")


def downsample(x: torch.Tensor, scale_factor: float) -> torch.Tensor:
    """Downsample the spatial dimensions of ``x`` by ``scale_factor``.

    3-D ``[N, C, L]``, 4-D ``[N, C, H, W]`` and 5-D ``[N, C, D, H, W]`` inputs use linear,
    bilinear and trilinear interpolation (``align_corners=False``); ``scale_factor == 1``
    returns ``x`` itself.

    Raises:
        ValueError: for ``scale_factor`` outside (0, 1], or another rank when
            ``scale_factor != 1``.

    Example:
        >>> sbfunc.score.downsample(torch.ones(2, 3, 8, 8), 0.5).shape
        torch.Size([2, 3, 4, 4])
    """
    scale_factor = check_scale_factor(scale_factor)
    if scale_factor == 1.0:
        return x
    if x.dim() not in _MODES:
        raise ValueError(
            f"downsampling (scale_factor={scale_factor}) needs a 3-D, 4-D or 5-D input "
            f"[N, C, *spatial]; got shape {tuple(x.shape)}"
        )
    spatial = tuple(x.shape[2:])
    if min(math.floor(size * scale_factor) for size in spatial) < 1:
        raise ValueError(
            f"scale_factor={scale_factor} shrinks the spatial size {spatial} to nothing; "
            f"use scale_factor >= {1 / min(spatial):.4g} (one element along the smallest "
            "dimension)"
        )
    return F.interpolate(
        x,
        scale_factor=scale_factor,
        mode=_MODES[x.dim()],
        align_corners=False,
        recompute_scale_factor=False,
    )


def downsample_batch(batch: Any, scale_factor: float, *, input: Field = 0) -> Any:
    """A copy of ``batch`` whose ``input`` field is downsampled (see :func:`downsample`).

    Example:
        >>> x, y = sbfunc.score.downsample_batch((torch.ones(2, 1, 4, 4), torch.zeros(2)), 0.5)
        >>> x.shape, y.shape
        (torch.Size([2, 1, 2, 2]), torch.Size([2]))
    """
    scale_factor = check_scale_factor(scale_factor)
    if scale_factor == 1.0:
        return batch
    if callable(input):
        raise TypeError(
            "downsampling needs input to be an int or str field of the batch, not a callable"
        )
    return replace(batch, input, downsample(extract(batch, input, "input"), scale_factor))


def check_downsampled_scoring(
    loss_fn: Callable[..., torch.Tensor],
    params: dict[str, torch.Tensor],
    buffers: dict[str, torch.Tensor],
    batch: Any,
    scale_factor: float,
    *,
    input: Field = 0,
    per_sample: PerSample = None,
) -> None:
    """Check, on one row (on zero rows for an empty batch), that ``loss_fn`` accepts the batch
    with its ``input`` downsampled by ``scale_factor``; raise a ``ValueError`` that says which
    factors work if it does not.

    A model whose head expects a fixed input size (a ``Linear`` after ``Flatten``) accepts no
    factor but 1; one with adaptive or global pooling accepts most. ``SelectiveBackprop``
    calls this once per input shape, on the host, before its first downsampled scoring.

    Args:
        loss_fn: the per-sample loss, ``loss_fn(params, buffers, batch) -> Tensor[N]``.
        params: the parameters ``loss_fn`` takes.
        buffers: the buffers ``loss_fn`` takes.
        batch: a batch (its first row is tried).
        scale_factor: the spatial scale to check, in (0, 1].
        input: where the input sits in the batch.
        per_sample: which leaves of ``batch`` are per-sample (:data:`sbfunc.types.PerSample`),
            to take its first row; ``None`` infers them.

    Raises:
        ValueError: naming the shapes, torch's error, and the factors among 3/4, 1/2 and 1/4
            that work (or saying that only 1 does and why).

    Example:
        >>> model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(8, 2))
        >>> loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy)
        >>> params, buffers = sbfunc.split_module(model)
        >>> batch = (torch.randn(4, 1, 8), torch.zeros(4, dtype=torch.long))
        >>> sbfunc.score.check_downsampled_scoring(loss_fn, params, buffers, batch, 0.5)
        Traceback (most recent call last):
        ...
        ValueError: scoring with scale_factor=0.5 ...only scale_factor=1 works...
    """

    def runs(factor: float) -> str | None:
        rows = min(1, batch_size(batch, per_sample=per_sample))
        one = take(batch, torch.zeros(rows, dtype=torch.int64), per_sample=per_sample)
        try:
            with torch.no_grad():
                loss_fn(params, buffers, downsample_batch(one, factor, input=input))
        except (RuntimeError, ValueError) as err:
            return str(err).splitlines()[0]
        return None

    failure = runs(scale_factor)
    if failure is None:
        return
    shape = tuple(extract(batch, input, "input").shape[1:])
    working = [f for f in (0.75, 0.5, 0.25) if f != scale_factor and runs(f) is None]
    advice = (
        f"scale_factors that work: {', '.join(map(str, working))} (and 1)"
        if working
        else "only scale_factor=1 works: the model needs inputs of the training size (e.g. a "
        "Linear layer after Flatten); score at full size, or give the model adaptive/global "
        "pooling"
    )
    raise ValueError(
        f"scoring with scale_factor={scale_factor} (inputs {shape} downsampled) fails in the "
        f"model: {failure}; {advice}"
    )
