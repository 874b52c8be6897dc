"""Image augmentation primitives of AugMix and RandAugment, on batches, with per-image draws.

Composer's primitives (adapted from the AugMix reference code) act on one PIL image and draw
their strength with numpy's global generator. Here one call applies one randomly chosen
primitive **per image** of a float batch ``[N, C, H, W]`` in ``[0, 1]``, with every random
number (which primitive, its level, its sign) drawn from an :mod:`sbfunc.random` key, on any
device, with static shapes: each primitive of the set runs on the whole batch and every image
keeps the result of its own choice (``torch.where``), the five geometric ones fused into one
affine warp with per-image matrices. The image ops are kornia's (``kornia.enhance``,
``kornia.geometry.transform``), which follow PIL's definitions.

Levels are on Composer's 0-10 scale: an intensity ``severity`` gives each application a
level drawn uniformly from ``[0.1, severity]`` (``[severity, severity]`` below 0.1), mapped
to each primitive's parameter as in Composer (e.g. rotate by ``int(level * 3)`` degrees).
The level-driven primitives of the ``"all"`` set are the identity at level 0 (``severity=0``);
``autocontrast``, ``equalize``, ``posterize`` (Composer keeps at most 4 bits) and the
``*_original`` enhancements (factor ``0.1 + 0.18 * level``) are not.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import NamedTuple

import torch

from sbfunc import random as sbrandom
from sbfunc.algorithms._kornia import kornia
from sbfunc.batch import extract, replace
from sbfunc.engine import Algorithm, Context, Event
from sbfunc.validation import check_real

__all__ = [
    "ImageAugmentation",
    "augment_once",
    "augmentation_sets",
    "check_augmentation_set",
    "check_images",
    "check_severity",
]

_GEOMETRIC = ("rotate", "shear_x", "shear_y", "translate_x", "translate_y")
_SAFE = ("autocontrast", "equalize", "posterize", "rotate", "solarize", *_GEOMETRIC[1:])

augmentation_sets: dict[str, tuple[str, ...]] = {
    "all": (*_SAFE, "color", "contrast", "brightness", "sharpness"),
    "safe": _SAFE,
    "original": (
        *_SAFE,
        "color_original",
        "contrast_original",
        "brightness_original",
        "sharpness_original",
    ),
}
"""Composer's sets: ``"all"``; ``"safe"`` (none of the ImageNet-C/CIFAR-10-C corruptions);
``"original"`` (the AugMix code's color/contrast/brightness/sharpness strengths)."""

_PRIMITIVES = frozenset(augmentation_sets["all"] + augmentation_sets["original"])


class _Draws(NamedTuple):
    """One application's per-image random numbers, each a tensor ``[N]``."""

    choice: torch.Tensor  # index into the set
    level: torch.Tensor  # in [0.1, severity]
    sign: torch.Tensor  # +-1 (rotations, shears, translations)
    symmetric: torch.Tensor  # enhancement factor, median 1 (the "all" set)
    original: torch.Tensor  # enhancement factor, 0.1 + 0.18 * level (the "original" set)


def check_augmentation_set(augmentation_set: str | Sequence[str]) -> tuple[str, ...]:
    """The primitives of a named set (``"all"``, ``"safe"``, ``"original"``) or of a sequence
    of primitive names, validated.

    Raises:
        ValueError: for an unknown set or primitive, or an empty sequence.

    Example:
        >>> check_augmentation_set(["rotate", "solarize"])
        ('rotate', 'solarize')
        >>> len(check_augmentation_set("all"))
        13

    References:
        MosaicML Composer ``augmentation_sets``.
    """
    if isinstance(augmentation_set, str):
        if augmentation_set not in augmentation_sets:
            raise ValueError(
                f"augmentation_set must be one of {sorted(augmentation_sets)} or a sequence of "
                f"primitive names, got {augmentation_set!r}"
            )
        return augmentation_sets[augmentation_set]
    names = tuple(augmentation_set)
    unknown = [n for n in names if n not in _PRIMITIVES]
    if not names or unknown:
        raise ValueError(
            f"augmentation_set must name primitives among {sorted(_PRIMITIVES)}, got {names!r}"
        )
    return names


def check_images(img: torch.Tensor) -> torch.Tensor:
    """``img`` as a float batch ``[N, C, H, W]`` clamped to ``[0, 1]`` (a ``[C, H, W]``
    image gets a batch dimension).

    Raises:
        TypeError: for a non-float tensor.
        ValueError: for another rank, or images smaller than 3 x 3 (``sharpness``'s kernel).

    Example:
        >>> check_images(torch.full((3, 4, 4), 2.0)).shape, float(check_images(
        ...     torch.full((3, 4, 4), 2.0)).max())
        (torch.Size([1, 3, 4, 4]), 1.0)
    """
    if not isinstance(img, torch.Tensor) or not img.dtype.is_floating_point:
        raise TypeError(f"images must be a float tensor in [0, 1], got {img!r:.60}")
    if img.dim() not in (3, 4) or min(img.shape[-2:]) < 3:
        raise ValueError(
            f"images must be [C, H, W] or [N, C, H, W] with H, W >= 3, got {img.shape}"
        )
    return (img if img.dim() == 4 else img.unsqueeze(0)).clamp(0, 1)


def check_severity(severity: float) -> float:
    """``severity`` on Composer's 0-10 scale, as a float.

    Raises:
        TypeError: for a non-number.
        ValueError: outside ``[0, 10]``.

    Example:
        >>> check_severity(3)
        3.0
    """
    return check_real(severity, "severity", low=0, high=10)


def _draws(key: sbrandom.Key, n: int, num_ops: int, severity: float, dev: torch.device) -> _Draws:
    u = sbrandom.uniform(key, (n, 5), device=dev)
    low = min(0.1, severity)
    level = low + (severity - low) * u[:, 1]
    up = u[:, 3] > 0.5  # Composer's _symmetric_sample: above 1 or below 1, equally likely
    above = 1 + (torch.clamp(level, min=1) - 1) * u[:, 4]
    below = 1 - 0.09 * level * u[:, 4]
    return _Draws(
        choice=(u[:, 0] * num_ops).long().clamp(max=num_ops - 1),
        level=level,
        sign=torch.where(u[:, 2] > 0.5, -1.0, 1.0),
        symmetric=torch.where(up, above, below),
        original=0.1 + 0.18 * level,
    )


def _autocontrast(x: torch.Tensor) -> torch.Tensor:
    """Stretch every channel of every image to ``[0, 1]`` (PIL ``autocontrast``, no cutoff)."""
    lo = x.amin(dim=(-2, -1), keepdim=True)
    hi = x.amax(dim=(-2, -1), keepdim=True)
    span = hi - lo
    stretched = (x - lo) / torch.where(span > 0, span, torch.ones_like(span))
    return torch.where(span > 0, stretched, x).clamp(0, 1)


def _color_op(name: str, x: torch.Tensor, d: _Draws) -> torch.Tensor:
    """The non-geometric primitive ``name`` on every image, with per-image parameters."""
    f = d.original if name.endswith("_original") else d.symmetric
    base = name.removesuffix("_original")
    enhance = kornia().enhance
    if base == "autocontrast":
        return _autocontrast(x)
    if base == "equalize":
        return enhance.equalize(x)
    if base == "posterize":  # Composer: 4 - int(level * 4 / 10) bits
        return enhance.posterize(x, 4 - (d.level * 0.4).long())
    if base == "solarize":  # PIL: invert the 8-bit values >= 256 - int(level * 25.6)
        return enhance.solarize(x, (256 - (d.level * 25.6).floor()) / 255)
    if base == "color":
        return enhance.adjust_saturation_with_gray_subtraction(x, f) if x.shape[1] == 3 else x
    if base == "contrast":
        return enhance.adjust_contrast_with_mean_subtraction(x, f)
    if base == "brightness":
        if name == "brightness":  # Composer scales the brightening factors by 0.75
            f = torch.where(f > 1, 0.75 * f, f)
        return enhance.adjust_brightness_accumulative(x, f)
    if base == "sharpness":
        return enhance.sharpness(x, f)
    raise AssertionError(name)  # pragma: no cover - names are validated


def _affine(name: str, d: _Draws, h: int, w: int) -> torch.Tensor:
    """Per-image forward (source -> destination) pixel matrices ``[N, 2, 3]`` of ``name``."""
    n, dev = d.level.shape[0], d.level.device
    m = torch.eye(2, 3, device=dev).expand(n, 2, 3).clone()
    if name == "rotate":  # Composer: int(level * 3) degrees, counter-clockwise or not
        centre = torch.tensor([(w - 1) / 2, (h - 1) / 2], device=dev).expand(n, 2)
        angle = d.sign * (d.level * 3).floor()
        rotation = kornia().geometry.transform.get_rotation_matrix2d
        return rotation(centre, angle, torch.ones(n, 2, device=dev))
    if name.startswith("shear"):  # PIL's affine about the top-left corner, 0.03 per level
        row, col = (0, 1) if name == "shear_x" else (1, 0)
        m[:, row, col] = -d.sign * d.level * 0.03
        return m
    size = w if name == "translate_x" else h  # Composer: int(level * size / 30) pixels
    m[:, 0 if name == "translate_x" else 1, 2] = -d.sign * (d.level * size / 30).floor()
    return m


def augment_once(
    x: torch.Tensor,
    *,
    key: sbrandom.Key,
    severity: float,
    augmentation_set: str | Sequence[str] = "all",
) -> torch.Tensor:
    """Apply one primitive of ``augmentation_set``, chosen per image, to every image.

    Each image draws its primitive uniformly from the set and its level uniformly from
    ``[0.1, severity]`` (see the module docs). Pure and device-agnostic: the same key gives
    the same images, and nothing reads tensor values on the host.

    Args:
        x: images ``[N, C, H, W]`` in ``[0, 1]``, ``H, W >= 3`` (see :func:`check_images`).
        key: an :mod:`sbfunc.random` key.
        severity: Composer's intensity, in [0, 10].
        augmentation_set: a set name or a sequence of primitive names.

    Returns:
        The augmented images, same shape, in ``[0, 1]``.

    Example:
        >>> x = torch.rand(4, 3, 8, 8)
        >>> out = augment_once(x, key=sbfunc.random.key(0), severity=3)
        >>> out.shape, bool(((out >= 0) & (out <= 1)).all())
        (torch.Size([4, 3, 8, 8]), True)
        >>> bool(torch.equal(out, augment_once(x, key=sbfunc.random.key(0), severity=3)))
        True

    References:
        Hendrycks et al. 2020, "AugMix" (the primitives and their strengths); MosaicML
        Composer ``augmentation_primitives``; kornia ``enhance`` and ``geometry.transform``.
    """
    ops = check_augmentation_set(augmentation_set)
    severity = check_severity(severity)
    n, _, h, w = x.shape
    d = _draws(key, n, len(ops), severity, x.device)
    chosen = [d.choice == i for i in range(len(ops))]
    out = x
    for op, pick in zip(ops, chosen, strict=True):
        if op not in _GEOMETRIC:
            out = torch.where(pick.view(n, 1, 1, 1), _color_op(op, x, d).to(x.dtype), out)
    if any(op in _GEOMETRIC for op in ops):
        m = torch.eye(2, 3, device=x.device).expand(n, 2, 3)
        for op, pick in zip(ops, chosen, strict=True):
            if op in _GEOMETRIC:
                m = torch.where(pick.view(n, 1, 1), _affine(op, d, h, w), m)
        moved = (m != torch.eye(2, 3, device=x.device)).flatten(1).any(1)
        warp = kornia().geometry.transform.warp_affine
        warped = warp(x, m.to(x.dtype), (h, w), mode="bilinear", padding_mode="zeros")
        out = torch.where(moved.view(n, 1, 1, 1), warped.clamp(0, 1), out)
    return out


class ImageAugmentation(Algorithm):
    """Base of the per-batch image augmentations: on ``AFTER_DATALOADER``, replace the
    batch's ``input`` field by ``self.transform(images, key=state.key)``.

    The default passes run Selective Backprop first on that event, so it scores the raw batch
    and only the rows it keeps are augmented. Subclasses set ``input`` and define
    ``transform``.

    Example:
        >>> class Invert(ImageAugmentation):
        ...     input = 0
        ...     def transform(self, images, *, key):
        ...         return 1 - images
        >>> ctx = sbfunc.Context(sbfunc.random.key(0), batch=(torch.zeros(1, 3, 4, 4), 0))
        >>> float(Invert().apply(sbfunc.Event.AFTER_DATALOADER, ctx).batch[0].min())
        1.0

    References:
        MosaicML Composer's batch augmentations (``CutOut``, ``ColOut`` with ``batch=True``).
    """

    input: int | str = 0

    @abstractmethod
    def transform(self, images: torch.Tensor, *, key: sbrandom.Key) -> torch.Tensor:
        """The augmented images."""

    events = frozenset({Event.AFTER_DATALOADER})

    def apply(self, event: Event, ctx: Context) -> Context:
        x = extract(ctx.batch, self.input, "input")
        return ctx.replace(batch=replace(ctx.batch, self.input, self.transform(x, key=ctx.key)))
