import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc import random as sbrandom
from sbfunc.algorithms._image_ops import (
    _GEOMETRIC,
    _PRIMITIVES,
    ImageAugmentation,
    _affine,
    _color_op,
    _Draws,
    augment_once,
    augmentation_sets,
    check_augmentation_set,
    check_images,
)

common = settings(max_examples=20, deadline=None, derandomize=True, database=None)
LEVEL_DRIVEN = tuple(
    op for op in augmentation_sets["all"] if op not in ("autocontrast", "equalize", "posterize")
)


def _images(seed, n=5, c=3, h=9, w=11):
    return sbrandom.uniform(sbrandom.key(seed), (n, c, h, w))


def _fixed(n, level, sign=1.0, factor=1.0):
    """Draws with every image at the same level, sign and enhancement factor."""
    full = torch.full((n,), float(level))
    return _Draws(
        torch.zeros(n, dtype=torch.long),
        full,
        torch.full((n,), sign),
        torch.full((n,), factor),
        0.1 + 0.18 * full,
    )


@common
@given(st.integers(0, 2**32), st.sampled_from(["all", "safe", "original"]), st.floats(0, 10))
def test_one_primitive_per_image_from_the_key_only(seed, name, severity):
    x = _images(seed)
    before = x.clone()
    out = augment_once(x, key=sbrandom.key(seed), severity=severity, augmentation_set=name)
    assert out.shape == x.shape and out.dtype == x.dtype and torch.equal(x, before)
    assert bool(((out >= 0) & (out <= 1)).all())
    again = augment_once(x, key=sbrandom.key(seed), severity=severity, augmentation_set=name)
    assert torch.equal(out, again)
    # images are augmented independently: a prefix of the batch gets the same images
    prefix = augment_once(x[:2], key=sbrandom.key(seed), severity=severity, augmentation_set=name)
    torch.testing.assert_close(prefix, out[:2])


@common
@given(st.integers(0, 2**32), st.sampled_from([1, 3]))
def test_level_driven_primitives_are_the_identity_at_severity_zero(seed, channels):
    x = _images(seed, c=channels)
    out = augment_once(x, key=sbrandom.key(seed), severity=0, augmentation_set=LEVEL_DRIVEN)
    torch.testing.assert_close(out, x, atol=1e-6, rtol=0)


def test_every_primitive_runs_on_colour_and_grey_images():
    for channels in (1, 3):
        x = _images(0, c=channels)
        for op in sorted(_PRIMITIVES):
            out = augment_once(x, key=sbrandom.key(1), severity=10, augmentation_set=[op])
            assert out.shape == x.shape and bool(((out >= 0) & (out <= 1)).all()), op
    grey = _images(0, c=1)
    colour_free = augment_once(grey, key=sbrandom.key(1), severity=10, augmentation_set=["color"])
    assert torch.equal(colour_free, grey)  # saturation means nothing for one channel


def test_primitives_follow_composers_parameters():
    x = _images(3, n=2, h=30, w=30)
    top = _fixed(2, level=10)
    assert torch.equal(_color_op("solarize", x, top), 1 - x)  # threshold 256 - 256: all
    assert torch.equal(_color_op("posterize", x, top), torch.zeros_like(x))  # 4 - 4 bits
    stretched = _color_op("autocontrast", x * 0.5 + 0.2, top)
    assert torch.allclose(stretched.amin((2, 3)), torch.zeros(2, 3), atol=1e-6)
    assert torch.allclose(stretched.amax((2, 3)), torch.ones(2, 3), atol=1e-6)
    bright = _color_op("brightness", x, _fixed(2, level=10, factor=1.2))
    torch.testing.assert_close(bright, (x * 0.9).clamp(0, 1))  # Composer: 0.75 * 1.2
    # translate_x: int(10 * 30 / 30) = 10 pixels; shear_x: x_in = x_out + 0.3 * y_out
    from kornia.geometry.transform import warp_affine

    shifted = warp_affine(x, _affine("translate_x", top, 30, 30), (30, 30))
    torch.testing.assert_close(shifted[..., :20], x[..., 10:], atol=1e-5, rtol=0)
    assert float(shifted[..., 21:].abs().max()) < 1e-5
    sheared = warp_affine(x, _affine("shear_x", top, 30, 30), (30, 30))
    torch.testing.assert_close(sheared[..., 10, :20], x[..., 10, 3:23], atol=1e-5, rtol=0)
    rotated = _affine("rotate", top, 30, 30)  # 30 degrees about the centre
    centre = torch.tensor([14.5, 14.5, 1.0])
    torch.testing.assert_close(rotated[0] @ centre, centre[:2])
    assert all(op in _PRIMITIVES for op in _GEOMETRIC)


def test_augmentation_sets_and_validation():
    assert len(check_augmentation_set("all")) == 13 and len(check_augmentation_set("safe")) == 9
    assert "color_original" in check_augmentation_set("original")
    assert check_augmentation_set(("rotate", "rotate")) == ("rotate", "rotate")
    for bad in ("fancy", [], ["rotate", "zoom"]):
        with pytest.raises(ValueError, match="augmentation_set"):
            check_augmentation_set(bad)
    with pytest.raises(ValueError, match="severity"):
        augment_once(_images(0), key=sbrandom.key(0), severity=11)


def test_check_images():
    assert check_images(torch.rand(3, 5, 5)).shape == (1, 3, 5, 5)
    assert float(check_images(torch.full((1, 1, 3, 3), -2.0)).min()) == 0.0
    with pytest.raises(TypeError, match="float tensor"):
        check_images(torch.zeros(1, 3, 4, 4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="H, W >= 3"):
        check_images(torch.rand(1, 3, 2, 8))
    with pytest.raises(ValueError, match="H, W >= 3"):
        check_images(torch.rand(8, 8))


def test_image_augmentation_base_reads_and_writes_the_input_field():
    class Half(ImageAugmentation):
        input = "img"

        def transform(self, images, *, key):
            return images / 2

    state = sbfunc.Context(sbrandom.key(0), batch={"img": torch.ones(2, 1, 3, 3), "y": 1})
    out = Half().apply(sbfunc.Event.AFTER_DATALOADER, state)
    assert float(out.batch["img"].max()) == 0.5 and out.batch["y"] == 1
    assert Half().match(sbfunc.Event.AFTER_DATALOADER, state)
    assert not Half().match(sbfunc.Event.BEFORE_FORWARD, state)
