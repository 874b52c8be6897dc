"""AugMix: mix each image with a random convex combination of randomly augmented copies."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sbfunc import random as sbrandom
from sbfunc.algorithms._image_ops import (
    ImageAugmentation,
    augment_once,
    check_augmentation_set,
    check_images,
    check_severity,
)
from sbfunc.algorithms._kornia import kornia
from sbfunc.batch import check_field
from sbfunc.validation import check_int, check_real

__all__ = ["AugMix", "augmix_image"]

_MAX_RANDOM_DEPTH = 3  # depth=-1 draws each chain's depth from {1, 2, 3}, as Composer does


def _check_depth(depth: int) -> int:
    wanted = "pass -1 (a random depth in 1..3) or a depth >= 1"
    if check_int(depth, "depth", low=-1, fix=wanted) == 0:
        raise ValueError(f"depth must be -1 or an int >= 1, got 0; {wanted}")
    return depth


def augmix_image(
    img: torch.Tensor,
    *,
    key: sbrandom.Key,
    severity: float = 3,
    depth: int = -1,
    width: int = 3,
    alpha: float = 1.0,
    augmentation_set: str | Sequence[str] = "all",
) -> torch.Tensor:
    """AugMix: ``(1 - m) * x + m * sum_i w_i * chain_i(x)``, drawn per image.

    For every image: ``width`` chains, each of ``depth`` primitives of ``augmentation_set``
    (``depth=-1``: 1 to 3, drawn per chain) applied one after the other with Composer's
    ``severity`` (see :mod:`sbfunc.algorithms`); chain weights
    ``w ~ Dirichlet(alpha, ..., alpha)`` and ``m ~ Beta(alpha, alpha)``. Every draw comes
    from ``key``; the images stay in ``[0, 1]`` (a convex combination) and keep their shape.
    Static shapes (random depths run the three steps and keep the first ``depth``), so it
    compiles; it costs about ``width * max depth`` passes of every primitive of the set.

    Args:
        img: one image ``[C, H, W]`` or a batch ``[N, C, H, W]``, floats in ``[0, 1]``
            (values outside are clamped), ``H, W >= 3``.
        key: an :mod:`sbfunc.random` key.
        severity: Composer's intensity, in [0, 10].
        depth: primitives per chain, >= 1, or -1 for a random depth in 1..3.
        width: chains per image, >= 1.
        alpha: Dirichlet and Beta concentration, > 0.
        augmentation_set: ``"all"``, ``"safe"``, ``"original"`` or primitive names.

    Returns:
        The mixed images, shaped like ``img``.

    Raises:
        ValueError: for an argument out of range or an image of the wrong rank.
        TypeError: for a non-float image.

    Example:
        >>> from sbfunc.algorithms import augmix_image
        >>> x = torch.rand(2, 3, 8, 8)
        >>> out = augmix_image(x, key=sbfunc.random.key(0))
        >>> out.shape, bool(torch.equal(out, augmix_image(x, key=sbfunc.random.key(0))))
        (torch.Size([2, 3, 8, 8]), True)
        >>> augmix_image(x[0], key=sbfunc.random.key(0), depth=1, width=2).shape
        torch.Size([3, 8, 8])

    References:
        Hendrycks et al. 2020, "AugMix: A Simple Data Processing Method to Improve Robustness
        and Uncertainty"; MosaicML Composer ``augmix_image``.
    """
    severity = check_severity(severity)
    depth = _check_depth(depth)
    width = check_int(width, "width", low=1)
    alpha = check_real(alpha, "alpha", low=0, open_low=True)
    ops = check_augmentation_set(augmentation_set)
    x = check_images(img)
    n, dev = x.shape[0], x.device
    k_weights, k_mix, k_depth, k_ops = sbrandom.split(key, 4)
    g = sbrandom.gamma(k_weights, alpha, (n, width), device=dev)
    weights = g / g.sum(1, keepdim=True).clamp_min(torch.finfo(g.dtype).tiny)
    m = sbrandom.beta(k_mix, alpha, alpha, (n,), device=dev).to(x.dtype).view(n, 1, 1, 1)
    steps = _MAX_RANDOM_DEPTH if depth == -1 else depth
    depths = sbrandom.randint(k_depth, (n, width), 1, _MAX_RANDOM_DEPTH + 1, device=dev)
    op_keys = sbrandom.split(k_ops, width * steps)
    mixed = torch.zeros_like(x)
    for c in range(width):
        chain = x
        for s in range(steps):
            out = augment_once(
                chain, key=op_keys[c * steps + s], severity=severity, augmentation_set=ops
            )
            chain = (
                out
                if depth != -1
                else torch.where((s < depths[:, c]).view(n, 1, 1, 1), out, chain)
            )
        mixed = mixed + weights[:, c].to(x.dtype).view(n, 1, 1, 1) * chain
    out = ((1 - m) * x + m * mixed).clamp(0, 1)
    return out if img.dim() == 4 else out.squeeze(0)


class AugMix(ImageAugmentation):
    """AugMix on every batch, on ``AFTER_DATALOADER`` (see :func:`augmix_image`).

    Composer inserts AugMix into the dataset's transforms on ``FIT_START``; here it augments
    the batch as a tensor, per image, from the step's key, on the batch's device (images in
    ``[0, 1]``, before normalisation). Selective Backprop, first on that event, scores the raw
    images. As in Composer, the Jensen-Shannon consistency loss of the paper is not included.

    Args:
        severity: Composer's intensity, in [0, 10].
        depth: primitives per chain, >= 1, or -1 for a random depth in 1..3.
        width: chains per image, >= 1.
        alpha: Dirichlet and Beta concentration, > 0.
        augmentation_set: ``"all"``, ``"safe"``, ``"original"`` or primitive names.
        input: where the images sit in the batch.

    Example:
        >>> from sbfunc.algorithms import AugMix
        >>> am = AugMix(severity=3, width=2)
        >>> ctx = sbfunc.Context(sbfunc.random.key(0), batch=(torch.rand(2, 3, 8, 8), None))
        >>> am.apply(sbfunc.Event.AFTER_DATALOADER, ctx).batch[0].shape
        torch.Size([2, 3, 8, 8])

    References:
        Hendrycks et al. 2020; MosaicML Composer ``AugMix``.
    """

    def __init__(
        self,
        severity: float = 3,
        depth: int = -1,
        width: int = 3,
        alpha: float = 1.0,
        augmentation_set: str | Sequence[str] = "all",
        *,
        input: int | str = 0,
    ) -> None:
        kornia()  # the optional extra, checked at construction
        self.severity = check_severity(severity)
        self.depth = _check_depth(depth)
        self.width = check_int(width, "width", low=1)
        self.alpha = check_real(alpha, "alpha", low=0, open_low=True)
        self.augmentation_set = check_augmentation_set(augmentation_set)
        self.input = check_field("input", input)

    def transform(self, images: torch.Tensor, *, key: sbrandom.Key) -> torch.Tensor:
        return augmix_image(
            images,
            key=key,
            severity=self.severity,
            depth=self.depth,
            width=self.width,
            alpha=self.alpha,
            augmentation_set=self.augmentation_set,
        )
