"""RandAugment: a few random augmentations per image, at a fixed severity."""

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
from sbfunc.validation import check_int

__all__ = ["RandAugment", "randaugment_image"]


def randaugment_image(
    img: torch.Tensor,
    *,
    key: sbrandom.Key,
    severity: float = 9,
    depth: int = 2,
    augmentation_set: str | Sequence[str] = "all",
) -> torch.Tensor:
    """RandAugment: ``depth`` primitives in a row, each drawn per image from the set.

    Every image draws its own sequence of primitives (uniformly from ``augmentation_set``)
    and their levels (Composer's ``severity``, see :mod:`sbfunc.algorithms`)
    from ``key``. ``depth=0`` returns the images (clamped to ``[0, 1]``). Static shapes; it
    costs ``depth`` passes of every primitive of the set.

    Args:
        img: one image ``[C, H, W]`` or a batch ``[N, C, H, W]``, floats in ``[0, 1]``
            (values outside are clamped), ``H, W >= 3``.
        key: an :mod:`sbfunc.random` key.
        severity: Composer's intensity, in [0, 10].
        depth: primitives per image, >= 0.
        augmentation_set: ``"all"``, ``"safe"``, ``"original"`` or primitive names.

    Returns:
        The augmented images, shaped like ``img``, in ``[0, 1]``.

    Raises:
        ValueError: for an argument out of range or an image of the wrong rank.
        TypeError: for a non-float image.

    Example:
        >>> from sbfunc.algorithms import randaugment_image
        >>> x = torch.rand(2, 3, 8, 8)
        >>> out = randaugment_image(x, key=sbfunc.random.key(0))
        >>> out.shape, bool(torch.equal(out, randaugment_image(x, key=sbfunc.random.key(0))))
        (torch.Size([2, 3, 8, 8]), True)
        >>> bool(torch.equal(randaugment_image(x, key=sbfunc.random.key(0), depth=0), x))
        True

    References:
        Cubuk et al. 2020, "RandAugment: Practical Automated Data Augmentation with a Reduced
        Search Space"; MosaicML Composer ``randaugment_image``.
    """
    severity = check_severity(severity)
    depth = check_int(depth, "depth", low=0)
    ops = check_augmentation_set(augmentation_set)
    x = check_images(img)
    if depth > 0:
        for k in sbrandom.split(key, depth):
            x = augment_once(x, key=k, severity=severity, augmentation_set=ops)
    return x if img.dim() == 4 else x.squeeze(0)


class RandAugment(ImageAugmentation):
    """RandAugment on every batch, on ``AFTER_DATALOADER`` (see :func:`randaugment_image`).

    Composer inserts RandAugment into the dataset's transforms on ``FIT_START``; here it
    augments the batch as a tensor, per image, from the step's key, on the batch's device
    (images in ``[0, 1]``, before normalisation). Selective Backprop, first on that event,
    scores the raw images.

    Args:
        severity: Composer's intensity, in [0, 10].
        depth: primitives per image, >= 0.
        augmentation_set: ``"all"``, ``"safe"``, ``"original"`` or primitive names.
        input: where the images sit in the batch.

    Example:
        >>> from sbfunc.algorithms import RandAugment
        >>> ra = RandAugment(severity=9, depth=2)
        >>> ctx = sbfunc.Context(sbfunc.random.key(0), batch=(torch.rand(2, 3, 8, 8), None))
        >>> ra.apply(sbfunc.Event.AFTER_DATALOADER, ctx).batch[0].shape
        torch.Size([2, 3, 8, 8])

    References:
        Cubuk et al. 2020; MosaicML Composer ``RandAugment``.
    """

    def __init__(
        self,
        severity: float = 9,
        depth: int = 2,
        augmentation_set: str | Sequence[str] = "all",
        *,
        input: int | str = 0,
    ) -> None:
        kornia()  # the optional extra, checked at construction
        self.severity = check_severity(severity)
        self.depth = check_int(depth, "depth", low=0)
        self.augmentation_set = check_augmentation_set(augmentation_set)
        self.input = check_field("input", input)

    def transform(self, images: torch.Tensor, *, key: sbrandom.Key) -> torch.Tensor:
        return randaugment_image(
            images,
            key=key,
            severity=self.severity,
            depth=self.depth,
            augmentation_set=self.augmentation_set,
        )
