"""CutMix: paste a box of a partner image into every image and mix the targets by area."""

from __future__ import annotations

import torch

from sbfunc import random as sbrandom
from sbfunc.algorithms._cutout import window_start
from sbfunc.algorithms._label_smoothing import soft_targets
from sbfunc.batch import check_field, extract, replace
from sbfunc.engine import Algorithm, Context, Event
from sbfunc.validation import check_bool, check_fraction, check_int, check_real

__all__ = ["CutMix", "cutmix_batch"]


def _is_dense(target: torch.Tensor, x: torch.Tensor) -> bool:
    """Composer's rule: a target with the input's height and width is per-pixel."""
    return target.dim() > 2 and target.shape[-2:] == x.shape[-2:]


def _box_sides(
    key: sbrandom.Key, alpha: float, length: float | None, h: int, w: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The box's height and width: ``int(length * size)``, or ``floor(size * sqrt(1 - lam))``."""
    if length is not None or alpha == 0:  # alpha = 0: lam = 0, a box as large as the image
        frac = 1.0 if length is None else length
        sides = torch.tensor([int(frac * h), int(frac * w)], device=device)
    else:
        lam = sbrandom.beta(key, alpha, alpha, (), device=device)
        sizes = torch.tensor([h, w], dtype=lam.dtype, device=device)
        sides = (sizes * torch.sqrt(1 - lam)).floor().long()
    return sides[0], sides[1]


def cutmix_batch(
    input: torch.Tensor,
    target: torch.Tensor,
    *,
    key: sbrandom.Key,
    alpha: float = 1.0,
    num_classes: int | None = None,
    length: float | None = None,
    uniform_sampling: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """CutMix: replace one box of every image by the same box of a random partner image.

    As in Composer, one box and one permutation per batch. The box's side is
    ``floor(size * sqrt(1 - lam))`` per axis with ``lam ~ Beta(alpha, alpha)`` (``alpha = 0``:
    a box as large as the image), or ``int(length * size)`` when ``length`` is given
    (``length = 0``: no box, the batch unchanged). Its position is drawn as in
    :func:`sbfunc.algorithms.cutout_batch` (``uniform_sampling``: every pixel equally likely
    mixed) and clipped at the border; ``area``, the fraction of each image left unmixed, is
    computed from the clipped box (Composer's adjusted lambda).

    Targets: per-pixel targets (``[N, H, W]`` indices or ``[N, C, H, W]`` soft targets, the
    input's height and width) get the same box pasted, so every pixel keeps the label of the
    image it now shows. Other targets (``[N]`` indices or ``[N, C]`` soft targets) become
    soft targets ``area * y + (1 - area) * y[perm]``.

    Static shapes and no host reads: the box is made of 0-d tensors and applied as a mask.

    Args:
        input: images ``[N, C, H, W]``.
        target: targets (see above).
        key: an :mod:`sbfunc.random` key.
        alpha: Beta concentration for the box area, >= 0 (ignored with ``length``).
        num_classes: needed for class-index (not per-pixel) targets.
        length: the box side as a fraction of each axis, in [0, 1], instead of ``alpha``.
        uniform_sampling: draw the box so that every pixel is equally likely mixed.

    Returns:
        ``(mixed_input, mixed_target, area, box)``: ``area`` a 0-d float tensor,
        ``box`` the ``int64`` tensor ``[top, left, bottom, right]`` (bottom/right excluded).

    Raises:
        ValueError: for an input that is not 4-D, a bad ``alpha``/``length``, or class-index
            targets without ``num_classes``.
        TypeError: for a non-bool ``uniform_sampling``.

    Example:
        >>> from sbfunc.algorithms import cutmix_batch
        >>> x, y = torch.rand(4, 3, 8, 8), torch.tensor([0, 1, 2, 3])
        >>> xm, ym, area, box = cutmix_batch(x, y, key=sbfunc.random.key(0), num_classes=4)
        >>> xm.shape, ym.shape, bool(torch.allclose(ym.sum(1), torch.ones(4)))
        (torch.Size([4, 3, 8, 8]), torch.Size([4, 4]), True)
        >>> seg = torch.randint(0, 5, (4, 8, 8))  # per-pixel labels are pasted, not mixed
        >>> cutmix_batch(x, seg, key=sbfunc.random.key(0))[1].dtype
        torch.int64

    References:
        Yun et al. 2019, "CutMix: Regularization Strategy to Train Strong Classifiers with
        Localizable Features"; MosaicML Composer ``cutmix_batch``.
    """
    if input.dim() != 4:
        raise ValueError(f"cutmix needs images [N, C, H, W], got shape {tuple(input.shape)}")
    alpha = check_real(alpha, "alpha", low=0)
    if length is not None:
        length = check_fraction(length, "length")
    check_bool(uniform_sampling, "uniform_sampling")
    dense = _is_dense(target, input)
    if not dense and not target.dtype.is_floating_point:
        if num_classes is None:
            raise ValueError("num_classes is needed to make soft targets of class indices")
        check_int(num_classes, "num_classes", low=1)
    n, (h, w), dev = input.shape[0], input.shape[-2:], input.device
    side_key, pos_key, perm_key = sbrandom.split(key, 3)
    u = sbrandom.uniform(pos_key, (2,), device=dev)
    side_h, side_w = _box_sides(side_key, alpha, length, h, w, dev)
    top = window_start(u[0], h, side_h, uniform_sampling=uniform_sampling).long()
    left = window_start(u[1], w, side_w, uniform_sampling=uniform_sampling).long()
    bottom, right = (top + side_h).clamp(0, h), (left + side_w).clamp(0, w)
    top, left = top.clamp(0, h), left.clamp(0, w)
    rows = torch.arange(h, device=dev)
    cols = torch.arange(w, device=dev)
    mask = ((rows >= top) & (rows < bottom)).unsqueeze(1) & ((cols >= left) & (cols < right))
    area = 1 - ((bottom - top) * (right - left)).to(torch.get_default_dtype()) / (h * w)
    perm = sbrandom.permutation(perm_key, n, device=dev)
    mixed_input = torch.where(mask, input[perm], input)
    if dense:
        mixed_target = torch.where(mask, target[perm], target)
    else:
        y = soft_targets(target, num_classes or 1)
        a = area.to(y.dtype)
        mixed_target = a * y + (1 - a) * y[perm]
    return mixed_input, mixed_target, area, torch.stack([top, left, bottom, right])


class CutMix(Algorithm):
    """Paste a box of a partner image into every image on ``BEFORE_FORWARD``.

    See :func:`cutmix_batch`. Like :class:`sbfunc.algorithms.MixUp` it changes inputs and targets
    in one place, after every ``AFTER_DATALOADER`` algorithm (so Selective Backprop has scored and
    pruned the raw batch), and declares ``interpolate_loss = True``: for cross-entropy the
    loss on the area-mixed soft targets is Composer's interpolated loss.

    Args:
        alpha: Beta concentration for the box area, >= 0; default 1 (the paper's).
        num_classes: for class-index targets (not needed for per-pixel targets).
        uniform_sampling: every pixel equally likely mixed.
        input: where the images sit in the batch.
        target: where the targets sit in the batch.

    Example:
        >>> from sbfunc.algorithms import CutMix
        >>> cm = CutMix(alpha=1.0, num_classes=3)
        >>> batch = (torch.rand(4, 3, 8, 8), torch.tensor([0, 1, 2, 0]))
        >>> ctx = sbfunc.Context(sbfunc.random.key(0), batch=batch)
        >>> cm.apply(sbfunc.Event.BEFORE_FORWARD, ctx).batch[1].shape
        torch.Size([4, 3])

    References:
        Yun et al. 2019; MosaicML Composer ``CutMix``.
    """

    interpolate_loss = True

    def __init__(
        self,
        alpha: float = 1.0,
        uniform_sampling: bool = False,
        *,
        num_classes: int | None = None,
        input: int | str = 0,
        target: int | str = 1,
    ) -> None:
        self.alpha = check_real(alpha, "alpha", low=0)
        self.uniform_sampling = check_bool(uniform_sampling, "uniform_sampling")
        self.num_classes = (
            None if num_classes is None else check_int(num_classes, "num_classes", low=1)
        )
        self.input = check_field("input", input)
        self.target = check_field("target", target)

    events = frozenset({Event.BEFORE_FORWARD})

    def apply(self, event: Event, ctx: Context) -> Context:
        x = extract(ctx.batch, self.input, "input")
        y = extract(ctx.batch, self.target, "target")
        xm, ym, _, _ = cutmix_batch(
            x,
            y,
            key=ctx.key,
            alpha=self.alpha,
            num_classes=self.num_classes,
            uniform_sampling=self.uniform_sampling,
        )
        return ctx.replace(batch=replace(replace(ctx.batch, self.input, xm), self.target, ym))
