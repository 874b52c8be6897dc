"""CutOut: zero random squares of the input (Composer's algorithm and its pure batch
transform)."""

from __future__ import annotations

import torch

from sbfunc import random as sbrandom
from sbfunc.batch import check_field, extract, replace
from sbfunc.engine import Algorithm, Context, Event
from sbfunc.validation import check_bool, check_fraction, check_int

__all__ = ["CutOut", "cutout_batch", "window_start"]


def window_start(
    u: torch.Tensor, size: int, side: int | torch.Tensor, *, uniform_sampling: bool
) -> torch.Tensor:
    """First index of a window of ``side`` cells on an axis of ``size`` cells, from uniform noise.

    By default the window's centre is uniform over the axis (``floor(u * size)``, the start
    ``side // 2`` before it); with ``uniform_sampling`` the start is uniform over
    ``[-(side - 1), size - 1]``, so that every cell is covered with the same probability
    ``side / (size + side - 1)``. The window may reach past the axis: callers clip it.

    Args:
        u: uniform noise in ``[0, 1)`` (any shape).
        size: the axis length.
        side: the window length (an int, or an integer tensor broadcast against ``u``).
        uniform_sampling: the sampling described above.

    Returns:
        A float tensor of integer start indices, shaped like ``u``.

    Example:
        >>> window_start(torch.tensor([0.0, 0.99]), 8, 4, uniform_sampling=False)
        tensor([-2.,  5.])
        >>> window_start(torch.tensor([0.0, 0.99]), 8, 4, uniform_sampling=True)
        tensor([-3.,  7.])

    References:
        DeVries and Taylor 2017 (Cutout's centre sampling); MosaicML Composer ``cutout_batch``
        and ``cutmix_batch`` (``uniform_sampling``).
    """
    if uniform_sampling:
        return (u * (size + side - 1)).floor() - (side - 1)
    return (u * size).floor() - side // 2


def cutout_batch(
    x: torch.Tensor,
    *,
    key: sbrandom.Key,
    num_holes: int = 1,
    length: float = 0.5,
    uniform_sampling: bool = False,
) -> torch.Tensor:
    """Zero ``num_holes`` random squares per sample (the same square in every channel).

    Each square has side ``round(length * min(spatial sizes))`` and is clipped at the border.
    By default its centre is drawn uniformly over the image (the paper's sampling), so pixels
    near the border are masked less often than central ones. With ``uniform_sampling`` the
    square's first row (column, ...) is drawn uniformly from ``-(side - 1)`` to ``size - 1``:
    every pixel is then masked with the same probability ``side / (size + side - 1)`` per
    dimension (Composer's option of that name). Works for inputs ``[N, C, *spatial]`` with one
    to three spatial dimensions, on the input's device, from an explicit key.

    Args:
        x: input batch ``[N, C, *spatial]``.
        key: an :mod:`sbfunc.random` key.
        num_holes: squares per sample, >= 1.
        length: side of each square as a fraction of the smallest spatial size, in (0, 1].
        uniform_sampling: draw the squares so that every pixel is equally likely masked.

    Returns:
        A new tensor; ``x`` is not modified.

    Raises:
        ValueError: for an input of rank other than 3-5, ``num_holes < 1`` or ``length``
            outside (0, 1].
        TypeError: for a non-float ``length`` or non-bool ``uniform_sampling``.

    Example:
        >>> out = sbfunc.algorithms.cutout_batch(torch.ones(2, 1, 8, 8), key=sbfunc.random.key(1))
        >>> out.shape, int((out == 0).sum(dim=(1, 2, 3))[0])
        (torch.Size([2, 1, 8, 8]), 16)
        >>> out = sbfunc.algorithms.cutout_batch(torch.ones(2, 1, 8, 8), key=sbfunc.random.key(1),
        ...                           uniform_sampling=True)
        >>> out.shape
        torch.Size([2, 1, 8, 8])

    References:
        DeVries and Taylor 2017, "Improved Regularization of Convolutional Neural Networks with
        Cutout"; MosaicML Composer ``cutout_batch`` (``uniform_sampling``).
    """
    if x.dim() < 3 or x.dim() > 5:
        raise ValueError(f"cutout needs an input [N, C, *spatial] of rank 3-5, got {x.dim()}-D")
    check_int(num_holes, "num_holes", low=1)
    check_fraction(length, "length", open_low=True)
    check_bool(uniform_sampling, "uniform_sampling")
    n, spatial = x.shape[0], x.shape[2:]
    side = max(1, round(length * min(spatial)))
    u = sbrandom.uniform(key, (n, num_holes, len(spatial)), device=x.device)
    keep = torch.ones((n, *spatial), dtype=torch.bool, device=x.device)
    for h in range(num_holes):
        inside = torch.ones_like(keep)
        for d, size in enumerate(spatial):
            lo = window_start(u[:, h, d], size, side, uniform_sampling=uniform_sampling)
            lo = lo.view(n, *([1] * len(spatial)))
            pos = torch.arange(size, device=x.device).view(
                *([1] * (d + 1)), size, *([1] * (len(spatial) - d - 1))
            )
            inside = inside & (pos >= lo) & (pos < lo + side)
        keep = keep & ~inside
    return x * keep.unsqueeze(1).to(x.dtype)


class CutOut(Algorithm):
    """Zero random squares of the input on ``AFTER_DATALOADER`` (see
    :func:`sbfunc.algorithms.cutout_batch`).

    Runs after any sample-selecting algorithm on that event (default passes), so it augments
    only the kept rows and never the rows Selective Backprop scores. ``uniform_sampling`` makes
    every pixel equally likely to be masked (Composer's option).

    Example:
        >>> co = sbfunc.algorithms.CutOut(length=0.5)
        >>> batch = (torch.ones(2, 1, 4, 4), torch.zeros(2))
        >>> ctx = sbfunc.Context(sbfunc.random.key(0), batch=batch)
        >>> int((co.apply(sbfunc.Event.AFTER_DATALOADER, ctx).batch[0] == 0).sum())
        8

    References:
        DeVries and Taylor 2017; MosaicML Composer ``CutOut``.
    """

    def __init__(
        self,
        num_holes: int = 1,
        length: float = 0.5,
        uniform_sampling: bool = False,
        *,
        input: int | str = 0,
    ) -> None:
        self.num_holes = check_int(num_holes, "num_holes", low=1)
        self.length = check_fraction(length, "length", open_low=True)
        self.uniform_sampling = check_bool(uniform_sampling, "uniform_sampling")
        self.input = check_field("input", input)

    events = frozenset({Event.AFTER_DATALOADER})

    def apply(self, event: Event, ctx: Context) -> Context:
        x = extract(ctx.batch, self.input, "input")
        x = cutout_batch(
            x,
            key=ctx.key,
            num_holes=self.num_holes,
            length=self.length,
            uniform_sampling=self.uniform_sampling,
        )
        return ctx.replace(batch=replace(ctx.batch, self.input, x))
