"""Pure, key-driven batch transforms behind the CutOut, MixUp and LabelSmoothing algorithms."""

from __future__ import annotations

import torch

from sbfunc import random as sbrandom
from sbfunc.validation import check_bool, check_fraction, check_int, check_real

__all__ = [
    "cutout_batch",
    "mixup_batch",
    "smooth_labels",
    "soft_targets",
    "window_start",
]


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
        >>> from sbfunc.algorithms.augment import window_start
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


def soft_targets(targets: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Class indices to one-hot float targets with the class axis second; floats pass through.

    ``[N]`` becomes ``[N, C]`` and per-pixel (per-token) indices ``[N, *dims]`` become
    ``[N, C, *dims]``, the layout ``torch.nn.functional.cross_entropy`` takes for probability
    targets. An index outside ``[0, C)`` (an ignore label such as ``-1`` or ``255``) gives an
    all-zero target, as Composer's ``ensure_targets_one_hot`` does for negative labels; indices
    are not checked otherwise (that would need a device sync). Floating-point targets are
    returned as they are.

    Args:
        targets: integer class indices ``[N, *dims]``, or float targets.
        num_classes: the number of classes ``C``, >= 1.

    Returns:
        Float targets (the default dtype for one-hot ones).

    Raises:
        ValueError: if ``num_classes < 1``.

    Example:
        >>> sbfunc.algorithms.soft_targets(torch.tensor([1, 0]), 2)
        tensor([[0., 1.], [1., 0.]])
        >>> sbfunc.algorithms.soft_targets(torch.zeros(2, 4, 5, dtype=torch.long), 3).shape
        torch.Size([2, 3, 4, 5])

    References:
        PyTorch ``torch.nn.functional.cross_entropy`` (class-probability targets
        ``[N, C, d1, ...]``); MosaicML Composer ``composer.loss.utils.ensure_targets_one_hot``.
    """
    check_int(num_classes, "num_classes", low=1)
    if targets.dtype.is_floating_point:
        return targets
    classes = torch.arange(num_classes, device=targets.device)
    classes = classes.view(1, num_classes, *([1] * (targets.dim() - 1)))
    return (targets.unsqueeze(1) == classes).to(torch.get_default_dtype())


def smooth_labels(targets: torch.Tensor, smoothing: float, num_classes: int) -> torch.Tensor:
    """Label smoothing: ``(1 - smoothing) * onehot(y) + smoothing / C`` (soft targets in).

    Index targets ``[N, *dims]`` become ``[N, C, *dims]`` (see :func:`soft_targets`); soft
    targets must already have the class axis second.

    Example:
        >>> sbfunc.algorithms.smooth_labels(torch.tensor([0]), 0.1, 2)
        tensor([[0.9500, 0.0500]])
        >>> sbfunc.algorithms.smooth_labels(torch.zeros(1, 4, 4, dtype=torch.long), 0.1, 2).shape
        torch.Size([1, 2, 4, 4])

    References:
        Szegedy et al. 2016, "Rethinking the Inception Architecture for Computer Vision";
        MosaicML Composer ``smooth_labels``.
    """
    check_fraction(smoothing, "smoothing")
    return (1.0 - smoothing) * soft_targets(targets, num_classes) + smoothing / num_classes


def _mixing_coefficient(key: sbrandom.Key, alpha: float, *, device: torch.device) -> torch.Tensor:
    """Composer's MixUp coefficient ``min(z, 1 - z)``, ``z ~ Beta(alpha, alpha)``; 0 at
    ``alpha = 0``. A 0-d tensor in ``[0, 0.5]``: the weight of the mixed-in partner."""
    if alpha == 0:
        return torch.zeros((), device=device)
    z = sbrandom.beta(key, float(alpha), float(alpha), (), device=device)
    return torch.minimum(z, 1 - z)


def mixup_batch(
    x: torch.Tensor,
    targets: torch.Tensor,
    *,
    key: sbrandom.Key,
    alpha: float = 0.2,
    num_classes: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """MixUp: convex combinations of random sample pairs and of their targets.

    As in Composer, one coefficient per batch, ``mixing = min(z, 1 - z)`` with
    ``z ~ Beta(alpha, alpha)``, so the original sample always dominates (``mixing <= 0.5``)
    and the training accuracy stays meaningful; a random permutation ``perm`` pairs the rows:
    ``(1 - mixing) * x + mixing * x[perm]``, with soft targets mixed the same way.
    ``alpha = 0`` gives ``mixing = 0``: the batch unchanged (targets made soft). For losses
    linear in the target (cross-entropy with probability targets) the loss on the soft
    targets equals Composer's interpolated loss. Per-pixel index targets ``[N, H, W]`` become
    ``[N, C, H, W]`` (class axis second, see :func:`soft_targets`).

    Args:
        x: inputs ``[N, ...]``.
        targets: class indices ``[N, *dims]`` or soft targets ``[N, C, *dims]``.
        key: an :mod:`sbfunc.random` key.
        alpha: Beta concentration, >= 0.
        num_classes: number of classes ``C``.

    Returns:
        ``(mixed_x, mixed_targets, mixing)`` with ``mixing`` a 0-d tensor in ``[0, 0.5]``, the
        weight of the permuted partner (Composer's ``mixing``).

    Raises:
        ValueError: if ``alpha < 0`` or ``num_classes < 1``.

    Example:
        >>> x, y = torch.eye(4), torch.arange(4)
        >>> key = sbfunc.random.key(0)
        >>> xm, ym, mixing = sbfunc.algorithms.mixup_batch(x, y, key=key, num_classes=4)
        >>> bool(torch.allclose(xm, ym)), bool(mixing <= 0.5)  # one-hot inputs mix like targets
        (True, True)

    References:
        Zhang et al. 2018, "mixup: Beyond Empirical Risk Minimization"; MosaicML Composer
        ``mixup_batch`` and ``_gen_mixing_coef``.
    """
    alpha = check_real(alpha, "alpha", low=0)
    check_int(num_classes, "num_classes", low=1)
    mix_key, perm_key = sbrandom.split(key)
    mixing = _mixing_coefficient(mix_key, alpha, device=x.device)
    perm = sbrandom.permutation(perm_key, x.shape[0], device=x.device)
    y = soft_targets(targets, num_classes)
    m = mixing.to(x.dtype)
    mixed_x = (1 - m) * x + m * x[perm]
    my = mixing.to(y.dtype)
    mixed_y = (1 - my) * y + my * y[perm]
    return mixed_x, mixed_y, mixing
