import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc import random as sbrandom
from sbfunc.algorithms import AugMix, augmix_image
from sbfunc.algorithms._image_ops import _autocontrast, augmentation_sets

common = settings(max_examples=12, deadline=None, derandomize=True, database=None)
LEVEL_DRIVEN = tuple(
    op for op in augmentation_sets["all"] if op not in ("autocontrast", "equalize", "posterize")
)


def _images(seed, n=4, h=8, w=8):
    return sbrandom.uniform(sbrandom.key(seed), (n, 3, h, w))


@common
@given(st.integers(0, 2**32), st.sampled_from([-1, 1, 2]), st.integers(1, 3), st.floats(0.1, 5))
def test_augmix_is_pure_per_image_and_stays_in_range(seed, depth, width, alpha):
    x = _images(seed)
    before = x.clone()
    kw = {"depth": depth, "width": width, "alpha": alpha}
    out = augmix_image(x, key=sbrandom.key(seed), **kw)
    assert out.shape == x.shape and torch.equal(x, before)
    assert bool(((out >= 0) & (out <= 1)).all())
    assert torch.equal(out, augmix_image(x, key=sbrandom.key(seed), **kw))
    single = augmix_image(x[0], key=sbrandom.key(seed), **kw)  # one image [C, H, W]
    torch.testing.assert_close(single, augmix_image(x[:1], key=sbrandom.key(seed), **kw)[0])


@common
@given(st.integers(0, 2**32))
def test_augmix_is_the_identity_at_zero_severity(seed):
    x = _images(seed)
    out = augmix_image(x, key=sbrandom.key(seed), severity=0, augmentation_set=LEVEL_DRIVEN)
    torch.testing.assert_close(out, x, atol=1e-5, rtol=0)


@common
@given(st.integers(0, 2**32))
def test_augmix_is_a_convex_combination_of_the_image_and_its_chains(seed):
    x = _images(seed) * 0.6 + 0.2
    # autocontrast is idempotent, so every chain gives the same image a
    out = augmix_image(x, key=sbrandom.key(seed), augmentation_set=["autocontrast"])
    a = _autocontrast(x)
    lo, hi = torch.minimum(x, a), torch.maximum(x, a)
    assert bool(((out >= lo - 1e-5) & (out <= hi + 1e-5)).all())
    weight = ((out - x) / (a - x)).flatten(1)  # the Beta draw m, one per image
    valid = (a - x).abs().flatten(1) > 1e-2
    for w, v in zip(weight, valid, strict=True):
        assert float(w[v].max() - w[v].min()) < 1e-3  # one mixing weight per image


@pytest.mark.parametrize(
    ("kwargs", "exc", "msg"),
    [
        ({"depth": 0}, ValueError, "depth"),
        ({"width": 0}, ValueError, "width"),
        ({"alpha": 0.0}, ValueError, "alpha"),
        ({"severity": 11}, ValueError, "severity"),
        ({"augmentation_set": "most"}, ValueError, "augmentation_set"),
    ],
)
def test_augmix_errors(kwargs, exc, msg):
    with pytest.raises(exc, match=msg):
        augmix_image(_images(0), key=sbrandom.key(0), **kwargs)
    with pytest.raises(exc, match=msg):
        AugMix(**kwargs)


def test_augmix_algorithm_augments_the_input_from_the_state_key():
    am = AugMix(severity=5, depth=2, width=2, input="image")
    batch = {"image": _images(1), "label": torch.arange(4)}
    state = sbfunc.Context(sbrandom.key(7), batch=batch)
    out = am.apply(sbfunc.Event.AFTER_DATALOADER, state)
    expected = augmix_image(batch["image"], key=state.key, severity=5, depth=2, width=2)
    assert torch.equal(out.batch["image"], expected) and out.batch["label"] is batch["label"]
    assert am.match(sbfunc.Event.AFTER_DATALOADER, state)
    assert not am.match(sbfunc.Event.FIT_START, state)
