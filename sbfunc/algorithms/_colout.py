"""ColOut: drop random rows and columns of a batch of images (and of per-pixel targets)."""

from __future__ import annotations

from typing import Literal

import torch

from sbfunc import random as sbrandom
from sbfunc.batch import check_field, extract, replace
from sbfunc.engine import Algorithm, Context, Event
from sbfunc.validation import check_real

__all__ = ["ColOut", "colout_batch"]

ResizeTarget = bool | Literal["auto"]


def _check_resize_target(resize_target: ResizeTarget) -> ResizeTarget:
    if not (isinstance(resize_target, bool) or resize_target == "auto"):
        raise ValueError(f"resize_target must be True, False or 'auto', got {resize_target!r}")
    return resize_target


def kept_indices(key: sbrandom.Key, size: int, keep: int, device: torch.device) -> torch.Tensor:
    """``keep`` distinct indices of ``range(size)`` drawn uniformly, in increasing order.

    Example:
        >>> idx = kept_indices(sbfunc.random.key(0), 10, 4, torch.device("cpu"))
        >>> idx.shape, bool((idx[1:] > idx[:-1]).all())
        (torch.Size([4]), True)

    References:
        MosaicML Composer ``colout_batch`` (``sorted(randperm(size)[:keep])``).
    """
    return sbrandom.permutation(key, size, device=device)[:keep].sort().values


def colout_batch(
    input: torch.Tensor,
    target: torch.Tensor | None = None,
    *,
    key: sbrandom.Key,
    p_row: float = 0.15,
    p_col: float = 0.15,
    resize_target: ResizeTarget = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Drop the same random rows and columns from every image of a batch (and its targets).

    Keeps ``max(1, int((1 - p_row) * H))`` rows and ``max(1, int((1 - p_col) * W))`` columns,
    drawn uniformly without replacement and kept in order, the same for the whole batch, as
    Composer does. The output size depends only on the input size and the fractions, so the
    shapes are static (one compiled graph per input size). With ``resize_target`` the target
    loses the same rows and columns; ``"auto"`` does so when the target has more than two
    dimensions and the input's height and width (a segmentation mask).

    Args:
        input: images ``[..., H, W]`` (e.g. ``[N, C, H, W]``).
        target: the targets, or ``None``.
        key: an :mod:`sbfunc.random` key.
        p_row: fraction of rows dropped, in [0, 1).
        p_col: fraction of columns dropped, in [0, 1).
        resize_target: ``True``, ``False`` or ``"auto"`` (see above).

    Returns:
        ``(input, target)`` with rows and columns dropped; ``target`` is returned as it came
        when it is not resized.

    Raises:
        ValueError: for fractions outside [0, 1), a bad ``resize_target``, an input with
            fewer than 2 dimensions, or ``resize_target=True`` with a target that does not
            have the input's height and width.

    Example:
        >>> from sbfunc.algorithms import colout_batch
        >>> x, mask = torch.rand(2, 3, 20, 10), torch.zeros(2, 20, 10, dtype=torch.long)
        >>> x2, mask2 = colout_batch(x, mask, key=sbfunc.random.key(0), p_row=0.25, p_col=0.2)
        >>> x2.shape, mask2.shape
        (torch.Size([2, 3, 15, 8]), torch.Size([2, 15, 8]))

    References:
        MosaicML Composer ``colout_batch`` and its ColOut method card.
    """
    p_row = check_real(p_row, "p_row", low=0, high=1, open_high=True)
    p_col = check_real(p_col, "p_col", low=0, high=1, open_high=True)
    resize_target = _check_resize_target(resize_target)
    if input.dim() < 2:
        raise ValueError(f"colout needs an input [..., H, W], got shape {tuple(input.shape)}")
    h, w = input.shape[-2:]
    spatial = target is not None and target.dim() > 2 and target.shape[-2:] == (h, w)
    if resize_target is True and not spatial:
        raise ValueError(
            "resize_target=True needs a target with the input's height and width "
            f"{(h, w)}, got {None if target is None else tuple(target.shape)}"
        )
    row_key, col_key = sbrandom.split(key)
    rows = kept_indices(row_key, h, max(1, int((1 - p_row) * h)), input.device)
    cols = kept_indices(col_key, w, max(1, int((1 - p_col) * w)), input.device)

    def crop(t: torch.Tensor) -> torch.Tensor:
        return t.index_select(-2, rows.to(t.device)).index_select(-1, cols.to(t.device))

    if target is not None and spatial and resize_target is not False:
        target = crop(target)
    return crop(input), target


class ColOut(Algorithm):
    """Drop random rows and columns of the images on ``AFTER_DATALOADER`` (see
    :func:`colout_batch`).

    The default passes run Selective Backprop first on that event, so it scores the raw,
    full-size batch (with its own ``scale_factor``) and ColOut shrinks only the kept rows.
    Composer's ``batch=False`` mode (a dataset transform) has no counterpart here: call
    :func:`colout_batch` in the dataset with a per-sample key instead.

    Args:
        p_row: fraction of rows dropped, in [0, 1).
        p_col: fraction of columns dropped, in [0, 1).
        resize_target: ``True``, ``False`` or ``"auto"`` (per-pixel targets shrink too).
        input: where the images sit in the batch.
        target: where the targets sit (read unless ``resize_target=False``).

    Example:
        >>> from sbfunc.algorithms import ColOut
        >>> co = ColOut(p_row=0.5, p_col=0.5)
        >>> ctx = sbfunc.Context(sbfunc.random.key(0),
        ...                      batch=(torch.rand(2, 3, 8, 8), torch.tensor([0, 1])))
        >>> co.apply(sbfunc.Event.AFTER_DATALOADER, ctx).batch[0].shape
        torch.Size([2, 3, 4, 4])

    References:
        MosaicML Composer ``ColOut``.
    """

    def __init__(
        self,
        p_row: float = 0.15,
        p_col: float = 0.15,
        resize_target: ResizeTarget = "auto",
        *,
        input: int | str = 0,
        target: int | str = 1,
    ) -> None:
        self.p_row = check_real(p_row, "p_row", low=0, high=1, open_high=True)
        self.p_col = check_real(p_col, "p_col", low=0, high=1, open_high=True)
        self.resize_target = _check_resize_target(resize_target)
        self.input = check_field("input", input)
        self.target = check_field("target", target)

    events = frozenset({Event.AFTER_DATALOADER})

    def apply(self, event: Event, ctx: Context) -> Context:
        x = extract(ctx.batch, self.input, "input")
        y = None if self.resize_target is False else extract(ctx.batch, self.target, "target")
        x, y = colout_batch(
            x,
            y,
            key=ctx.key,
            p_row=self.p_row,
            p_col=self.p_col,
            resize_target=self.resize_target,
        )
        batch = replace(ctx.batch, self.input, x)
        if y is not None:
            batch = replace(batch, self.target, y)
        return ctx.replace(batch=batch)
