"""Spatial downsampling of the scoring input (Composer's ``scale_factor``)."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from sbfunc.batch import Field, extract, replace

__all__ = ["check_scale_factor", "downsample", "downsample_batch"]

_MODES = {3: "linear", 4: "bilinear", 5: "trilinear"}


def check_scale_factor(scale_factor: float) -> float:
    """Validate ``scale_factor`` in (0, 1] and return it as a float.

    Example:
        >>> sbfunc.score.check_scale_factor(0.5)
        0.5
    """
    if isinstance(scale_factor, bool) or not isinstance(scale_factor, int | float):
        raise TypeError(f"scale_factor must be a float in (0, 1], got {scale_factor!r}")
    if not (math.isfinite(scale_factor) and 0 < scale_factor <= 1):
        raise ValueError(f"scale_factor must be in (0, 1], got {scale_factor!r}")
    return float(scale_factor)


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
