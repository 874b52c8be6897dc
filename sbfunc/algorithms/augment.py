"""Pure, key-driven batch transforms behind the CutOut, MixUp and LabelSmoothing algorithms."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from sbfunc import random as sbrandom

__all__ = ["check_probability", "cutout_batch", "mixup_batch", "smooth_labels", "soft_targets"]


def check_probability(name: str, value: float, *, open_low: bool = False) -> float:
    """Validate a float in [0, 1] (or (0, 1] with ``open_low``) and return it."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TypeError(f"{name} must be a finite float, got {value!r}")
    if not (0 < value <= 1 if open_low else 0 <= value <= 1):
        raise ValueError(f"{name} must be in {'(0, 1]' if open_low else '[0, 1]'}, got {value!r}")
    return float(value)


def cutout_batch(
    x: torch.Tensor, *, key: sbrandom.Key, num_holes: int = 1, length: float = 0.5
) -> torch.Tensor:
    """Zero ``num_holes`` random squares per sample (the same square in every channel).

    Each square has side ``round(length * min(spatial sizes))`` and a centre drawn uniformly
    over the image; squares are clipped at the border. Works for inputs ``[N, C, *spatial]``
    with one to three spatial dimensions, on the input's device, from an explicit key.

    Args:
        x: input batch ``[N, C, *spatial]``.
        key: an :mod:`sbfunc.random` key.
        num_holes: squares per sample, >= 1.
        length: side of each square as a fraction of the smallest spatial size, in (0, 1].

    Returns:
        A new tensor; ``x`` is not modified.

    Example:
        >>> out = sbfunc.cutout_batch(torch.ones(2, 1, 8, 8), key=sbfunc.random.key(1))
        >>> out.shape, int((out == 0).sum(dim=(1, 2, 3))[0])
        (torch.Size([2, 1, 8, 8]), 16)

    References:
        DeVries and Taylor 2017, "Improved Regularization of Convolutional Neural Networks with
        Cutout"; MosaicML Composer ``cutout_batch``.
    """
    if x.dim() < 3 or x.dim() > 5:
        raise ValueError(f"cutout needs an input [N, C, *spatial] of rank 3-5, got {x.dim()}-D")
    if isinstance(num_holes, bool) or not isinstance(num_holes, int) or num_holes < 1:
        raise ValueError(f"num_holes must be an int >= 1, got {num_holes!r}")
    check_probability("length", length, open_low=True)
    n, spatial = x.shape[0], x.shape[2:]
    side = max(1, round(length * min(spatial)))
    u = sbrandom.uniform(key, (n, num_holes, len(spatial)), device=x.device)
    keep = torch.ones((n, *spatial), dtype=torch.bool, device=x.device)
    for h in range(num_holes):
        inside = torch.ones_like(keep)
        for d, size in enumerate(spatial):
            centre = (u[:, h, d] * size).floor()  # uniform integer centre in [0, size)
            lo = (centre - side // 2).view(n, *([1] * len(spatial)))
            pos = torch.arange(size, device=x.device).view(
                *([1] * (d + 1)), size, *([1] * (len(spatial) - d - 1))
            )
            inside = inside & (pos >= lo) & (pos < lo + side)
        keep = keep & ~inside
    return x * keep.unsqueeze(1).to(x.dtype)


def soft_targets(targets: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Class indices ``[N]`` to one-hot float targets ``[N, C]``; float targets pass through.

    Example:
        >>> sbfunc.soft_targets(torch.tensor([1, 0]), 2)
        tensor([[0., 1.], [1., 0.]])

    References:
        PyTorch ``torch.nn.functional.one_hot``; MosaicML Composer
        ``composer.loss.utils.ensure_targets_one_hot``.
    """
    if targets.dtype.is_floating_point:
        return targets
    return F.one_hot(targets, num_classes).to(torch.get_default_dtype())


def smooth_labels(targets: torch.Tensor, smoothing: float, num_classes: int) -> torch.Tensor:
    """Label smoothing: ``(1 - smoothing) * onehot(y) + smoothing / C`` (soft targets in).

    Example:
        >>> sbfunc.smooth_labels(torch.tensor([0]), 0.1, 2)
        tensor([[0.9500, 0.0500]])

    References:
        Szegedy et al. 2016, "Rethinking the Inception Architecture for Computer Vision";
        MosaicML Composer ``smooth_labels``.
    """
    check_probability("smoothing", smoothing)
    return (1.0 - smoothing) * soft_targets(targets, num_classes) + smoothing / num_classes


def mixup_batch(
    x: torch.Tensor,
    targets: torch.Tensor,
    *,
    key: sbrandom.Key,
    alpha: float = 0.2,
    num_classes: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """MixUp: convex combinations of random sample pairs and of their targets.

    ``lam ~ Beta(alpha, alpha)`` (one per batch), a random permutation ``perm``, and returns
    ``lam * x + (1 - lam) * x[perm]`` with soft targets
    ``lam * onehot(y) + (1 - lam) * onehot(y[perm])``. For losses linear in the target
    (cross-entropy with probability targets) the loss on the soft targets equals Composer's
    interpolated loss ``lam * L(y) + (1 - lam) * L(y[perm])``.

    Args:
        x: inputs ``[N, ...]``.
        targets: class indices ``[N]`` or soft targets ``[N, C]``.
        key: an :mod:`sbfunc.random` key.
        alpha: Beta concentration, > 0.
        num_classes: number of classes ``C``.

    Returns:
        ``(mixed_x, mixed_targets, lam)`` with ``lam`` a 0-d tensor.

    Example:
        >>> x, y = torch.eye(4), torch.arange(4)
        >>> xm, ym, lam = sbfunc.mixup_batch(x, y, key=sbfunc.random.key(0), num_classes=4)
        >>> bool(torch.allclose(xm, ym))  # one-hot inputs mix exactly like their targets
        True

    References:
        Zhang et al. 2018, "mixup: Beyond Empirical Risk Minimization"; MosaicML Composer
        ``mixup_batch``.
    """
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not alpha > 0:
        raise ValueError(f"alpha must be a float > 0, got {alpha!r}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be an int >= 1, got {num_classes!r}")
    lam_key, perm_key = sbrandom.split(key)
    lam = sbrandom.beta(lam_key, float(alpha), float(alpha), (), device=x.device).to(x.dtype)
    perm = sbrandom.permutation(perm_key, x.shape[0], device=x.device)
    y = soft_targets(targets, num_classes)
    mixed_x = lam * x + (1 - lam) * x[perm]
    mixed_y = lam.to(y.dtype) * y + (1 - lam.to(y.dtype)) * y[perm]
    return mixed_x, mixed_y, lam
