"""Progressive resizing: train on smaller images first, then grow them to full size."""

from __future__ import annotations

import math
from typing import Literal

import torch

from sbfunc import random as sbrandom
from sbfunc.algorithms._kornia import kornia
from sbfunc.batch import check_field, extract, replace
from sbfunc.engine import Algorithm, Context, Event
from sbfunc.validation import check_bool, check_choice, check_int, check_real

__all__ = ["ProgressiveResizing", "resize_batch"]

ResizeMode = Literal["resize", "crop"]
_MODES: tuple[ResizeMode, ...] = ("resize", "crop")


def _scaled(size: int, scale_factor: float) -> int:
    """``int(size * scale_factor)`` (guarded against a product a rounding error below an
    integer), at least 1."""
    return max(1, int(size * scale_factor + 1e-6))


def _nearest(t: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Nearest-neighbour resize of the last two dimensions, for any dtype."""
    resize = kornia().geometry.transform.resize
    if t.dtype.is_floating_point:
        return resize(t, size, interpolation="nearest")
    return resize(t.to(torch.float32), size, interpolation="nearest").round().to(t.dtype)


def _crop(t: torch.Tensor, top: torch.Tensor, left: torch.Tensor, scale: float) -> torch.Tensor:
    """The window of ``t``'s last two dimensions that starts at row ``top`` and column
    ``left`` (0-d integer tensors) and is ``scale`` times as high and wide as ``t``."""
    h, w = t.shape[-2:]
    rows = top + torch.arange(_scaled(h, scale), device=t.device)
    cols = left + torch.arange(_scaled(w, scale), device=t.device)
    return t.index_select(-2, rows).index_select(-1, cols)


def resize_batch(
    input: torch.Tensor,
    target: torch.Tensor,
    scale_factor: float,
    *,
    mode: ResizeMode = "resize",
    resize_targets: bool = False,
    key: sbrandom.Key | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Shrink the height and width of a batch by ``scale_factor``, by resizing or cropping.

    The new size is ``int(H * scale_factor)`` by ``int(W * scale_factor)``. ``"resize"``
    interpolates with nearest neighbours (Composer's choice, kornia's
    ``geometry.transform.resize``); ``"crop"`` cuts one window of that size, at a position
    drawn from ``key``, the same for the whole batch. With ``resize_targets`` the targets
    (``[N, H, W]`` indices or ``[N, C, H, W]``) shrink the same way (index targets stay
    integers). ``scale_factor >= 1`` returns both unchanged, as in Composer. Shapes depend only
    on the input's shape and ``scale_factor`` (static); the crop position is a tensor.

    Args:
        input: images ``[N, C, H, W]`` (any rank >= 3; the last two dimensions shrink).
        target: the targets (returned as they came unless ``resize_targets``).
        scale_factor: the scale, > 0.
        mode: ``"resize"`` or ``"crop"``.
        resize_targets: shrink the targets too.
        key: an :mod:`sbfunc.random` key; needed for ``"crop"``.

    Returns:
        ``(input, target)``, resized.

    Raises:
        ValueError: for a bad ``scale_factor`` or ``mode``, an input of rank < 3, a target of
            rank < 3 with ``resize_targets``, or ``"crop"`` without a key.

    Example:
        >>> from sbfunc.algorithms import resize_batch
        >>> x, y = torch.rand(2, 3, 8, 8), torch.zeros(2, 8, 8, dtype=torch.long)
        >>> [t.shape for t in resize_batch(x, y, 0.5, resize_targets=True)]
        [torch.Size([2, 3, 4, 4]), torch.Size([2, 4, 4])]
        >>> resize_batch(x, y, 0.75, mode="crop", key=sbfunc.random.key(0))[0].shape
        torch.Size([2, 3, 6, 6])

    References:
        Howard and Gugger 2020 (fastai progressive resizing); MosaicML Composer
        ``resize_batch``.
    """
    scale_factor = check_real(scale_factor, "scale_factor", low=0, open_low=True)
    check_choice(mode, "mode", _MODES)
    check_bool(resize_targets, "resize_targets")
    if input.dim() < 3:
        raise ValueError(f"resizing needs an input of rank >= 3, got shape {tuple(input.shape)}")
    if resize_targets and target.dim() < 3:
        raise ValueError(
            f"resize_targets needs per-pixel targets of rank >= 3, got {tuple(target.shape)}"
        )
    if mode == "crop" and key is None:
        raise ValueError("mode='crop' draws the crop's position from a key: pass key=")
    if scale_factor >= 1:
        return input, target
    h, w = input.shape[-2:]
    if mode == "resize":
        out = _nearest(input, (_scaled(h, scale_factor), _scaled(w, scale_factor)))
        if resize_targets:
            th, tw = target.shape[-2:]
            target = _nearest(target, (_scaled(th, scale_factor), _scaled(tw, scale_factor)))
        return out, target
    assert key is not None
    top_key, left_key = sbrandom.split(key)
    top = sbrandom.randint(top_key, (), 0, h - _scaled(h, scale_factor) + 1, device=input.device)
    left = sbrandom.randint(left_key, (), 0, w - _scaled(w, scale_factor) + 1, device=input.device)
    out = _crop(input, top, left, scale_factor)
    if resize_targets:  # the same window, in the target's own pixels
        th, tw = target.shape[-2:]
        top_t, left_t = (top * th) // h, (left * tw) // w
        target = _crop(target, top_t.to(target.device), left_t.to(target.device), scale_factor)
    return out, target


class ProgressiveResizing(Algorithm):
    """Shrink the images on ``AFTER_DATALOADER`` by a scale that grows over training.

    Composer's schedule: the scale is ``initial_scale`` until ``delay_fraction`` of training,
    then grows linearly to 1 at ``1 - finetune_fraction``, and stays 1 for the finetuning
    tail. Below full size the new width is pinned to a multiple of ``size_increment`` (at
    least ``size_increment``, at most the width) and the height scales with it; at scale 1
    the images keep their size even when the width is no such multiple (Composer would pin
    it below the full width for the whole finetuning tail).

    Host decision, finite graphs: ``match`` computes the pinned scale on the host from
    ``state.time.elapsed`` and the input's *shape* (never its values) and returns it (``False``
    at full size: nothing runs). The scale reaches ``apply`` as ``state.matched``, a Python
    number from a finite set (one per pinned width), so a compiled step has one graph per
    size, at most ``width / size_increment`` of them, however long the run. The input size
    changes per stage: that is inherent to the method (expect one recompilation per size).

    The default passes run Selective Backprop first on ``AFTER_DATALOADER``: it scores the
    raw, full-size batch (downsampled only by its own ``scale_factor``), never an image this
    algorithm already shrank, and only the kept rows are resized.

    Args:
        mode: ``"resize"`` (nearest neighbours) or ``"crop"`` (a random window per batch).
        initial_scale: the scale at the start, in (0, 1].
        finetune_fraction: the fraction of training at full size at the end, in [0, 1].
        delay_fraction: the fraction of training at ``initial_scale``, in [0, 1], with
            ``delay_fraction + finetune_fraction <= 1``.
        size_increment: widths are multiples of it, >= 1.
        resize_targets: shrink per-pixel targets too.
        input: where the images sit in the batch.
        target: where the targets sit in the batch (read only with ``resize_targets``).

    Example:
        >>> from sbfunc.algorithms import ProgressiveResizing
        >>> pr = ProgressiveResizing(initial_scale=0.5, delay_fraction=0.5, finetune_fraction=0.2)
        >>> batch = (torch.rand(2, 3, 32, 32), torch.tensor([0, 1]))
        >>> ctx = sbfunc.Context(sbfunc.random.key(0), batch=batch,
        ...                      time=sbfunc.Time(elapsed=0.1))
        >>> scale = pr.match(sbfunc.Event.AFTER_DATALOADER, ctx); scale
        0.5
        >>> out = pr.apply(sbfunc.Event.AFTER_DATALOADER, ctx.replace(matched=scale))
        >>> out.batch[0].shape
        torch.Size([2, 3, 16, 16])
        >>> pr.match(sbfunc.Event.AFTER_DATALOADER, ctx.replace(time=sbfunc.Time(elapsed=0.9)))
        False

    References:
        Howard and Gugger 2020 (fastai progressive resizing); MosaicML Composer
        ``ProgressiveResizing``.
    """

    def __init__(
        self,
        mode: ResizeMode = "resize",
        initial_scale: float = 0.5,
        finetune_fraction: float = 0.2,
        delay_fraction: float = 0.5,
        size_increment: int = 4,
        resize_targets: bool = False,
        *,
        input: int | str = 0,
        target: int | str = 1,
    ) -> None:
        kornia()  # the optional extra, checked at construction
        self.mode: ResizeMode = check_choice(mode, "mode", _MODES)
        self.initial_scale = check_real(
            initial_scale, "initial_scale", low=0, high=1, open_low=True
        )
        self.finetune_fraction = check_real(finetune_fraction, "finetune_fraction", low=0, high=1)
        self.delay_fraction = check_real(delay_fraction, "delay_fraction", low=0, high=1)
        if self.delay_fraction + self.finetune_fraction > 1:
            raise ValueError(
                "delay_fraction + finetune_fraction must be <= 1, got "
                f"{self.delay_fraction} + {self.finetune_fraction}"
            )
        self.size_increment = check_int(size_increment, "size_increment", low=1)
        self.resize_targets = check_bool(resize_targets, "resize_targets")
        self.input = check_field("input", input)
        self.target = check_field("target", target)

    def scale_at(self, elapsed: float) -> float:
        """The schedule's (unpinned) scale at ``elapsed``, a fraction of training.

        Example:
            >>> from sbfunc.algorithms import ProgressiveResizing
            >>> pr = ProgressiveResizing(initial_scale=0.5, delay_fraction=0.4,
            ...                          finetune_fraction=0.2)
            >>> [pr.scale_at(t) for t in (0.0, 0.4, 0.6, 0.8, 1.0)]
            [0.5, 0.5, 0.75, 1.0, 1.0]
        """
        ramp = 1 - self.finetune_fraction - self.delay_fraction
        if elapsed < self.delay_fraction:
            progress = 0.0
        elif ramp <= 0:
            progress = 1.0
        else:
            progress = min(1.0, (elapsed - self.delay_fraction) / ramp)
        return self.initial_scale + (1 - self.initial_scale) * progress

    def pinned_scale(self, elapsed: float, width: int) -> float:
        """The scale at ``elapsed`` with the new width pinned to a multiple of
        ``size_increment`` (Composer's rounding), as ``new_width / width``.

        Example:
            >>> from sbfunc.algorithms import ProgressiveResizing
            >>> ProgressiveResizing(initial_scale=0.3, size_increment=8).pinned_scale(0.0, 64)
            0.25
        """
        return self._pin(self.scale_at(elapsed), width)

    def _pin(self, scale: float, width: int) -> float:
        inc = self.size_increment
        if scale >= 1:  # full size, even for a width that is not a multiple of inc
            return 1.0
        new = round(width * scale / inc) * inc
        return min(width, max(inc, new)) / width

    events = frozenset({Event.AFTER_DATALOADER})
    uses_elapsed = True

    def match(self, event: Event, ctx: Context) -> float | bool:
        if event != Event.AFTER_DATALOADER:
            return False
        scale = self.scale_at(ctx.time.elapsed)
        return scale if scale < 1 and math.isfinite(scale) else False

    def apply(self, event: Event, ctx: Context) -> Context:
        x = extract(ctx.batch, self.input, "input")
        scale = ctx.matched
        if isinstance(scale, bool):  # applied without its match decision (a direct call)
            scale = self.scale_at(ctx.time.elapsed)
        scale = self._pin(scale, x.shape[-1])  # the width is a shape: static when compiled
        if scale >= 1:
            return ctx
        if not self.resize_targets:
            x, _ = resize_batch(x, x, scale, mode=self.mode, key=ctx.key)
            return ctx.replace(batch=replace(ctx.batch, self.input, x))
        y = extract(ctx.batch, self.target, "target")
        x, y = resize_batch(x, y, scale, mode=self.mode, resize_targets=True, key=ctx.key)
        return ctx.replace(batch=replace(replace(ctx.batch, self.input, x), self.target, y))
