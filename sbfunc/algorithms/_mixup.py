"""MixUp: train on convex combinations of pairs of rows and of their targets (Composer's
algorithm and its pure batch transform)."""

from __future__ import annotations

import torch

from sbfunc import random as sbrandom
from sbfunc.algorithms._label_smoothing import soft_targets
from sbfunc.batch import check_field, extract, replace
from sbfunc.engine import Algorithm, Context, Event
from sbfunc.validation import check_int, check_real

__all__ = ["MixUp", "mixup_batch"]


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


class MixUp(Algorithm):
    """Mix random pairs of inputs and their targets on ``BEFORE_FORWARD``.

    Composer's coefficient: ``mixing = min(z, 1 - z)``, ``z ~ Beta(alpha, alpha)``, the weight
    of the partner, so the original row dominates; ``alpha = 0`` leaves the inputs unchanged.
    The loss on the mixed soft targets is Composer's interpolated loss for cross-entropy (see
    :func:`sbfunc.algorithms.mixup_batch`), so it declares ``interpolate_loss = True`` and the
    ``warn_if_multiple_loss_interpolation`` pass can flag conflicting algorithms. Per-pixel
    index targets ``[N, H, W]`` become soft targets ``[N, C, H, W]``.

    Example:
        >>> mu = sbfunc.algorithms.MixUp(alpha=0.2, num_classes=3)
        >>> ctx = sbfunc.Context(sbfunc.random.key(0),
        ...                      batch=(torch.randn(4, 2), torch.tensor([0, 1, 2, 0])))
        >>> mu.apply(sbfunc.Event.BEFORE_FORWARD, ctx).batch[1].shape
        torch.Size([4, 3])

    References:
        Zhang et al. 2018; MosaicML Composer ``MixUp``.
    """

    interpolate_loss = True

    def __init__(
        self, alpha: float = 0.2, *, num_classes: int, input: int | str = 0, target: int | str = 1
    ) -> None:
        self.alpha = check_real(alpha, "alpha", low=0)
        self.num_classes = check_int(num_classes, "num_classes", low=1)
        self.input = check_field("input", input)
        self.target = check_field("target", target)

    events = frozenset({Event.BEFORE_FORWARD})

    def apply(self, event: Event, ctx: Context) -> Context:
        x = extract(ctx.batch, self.input, "input")
        y = extract(ctx.batch, self.target, "target")
        xm, ym, _ = mixup_batch(x, y, key=ctx.key, alpha=self.alpha, num_classes=self.num_classes)
        return ctx.replace(batch=replace(replace(ctx.batch, self.input, xm), self.target, ym))
