import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc import random as sbrandom
from sbfunc.algorithms import RandAugment, randaugment_image
from sbfunc.algorithms._image_ops import _autocontrast, augment_once, augmentation_sets

common = settings(max_examples=15, deadline=None, derandomize=True, database=None)
LEVEL_DRIVEN = tuple(
    op for op in augmentation_sets["all"] if op not in ("autocontrast", "equalize", "posterize")
)


def _images(seed, n=4):
    return sbrandom.uniform(sbrandom.key(seed), (n, 3, 8, 8))


@common
@given(st.integers(0, 2**32), st.integers(0, 3), st.floats(0, 10))
def test_randaugment_is_depth_primitives_in_a_row(seed, depth, severity):
    x = _images(seed)
    before = x.clone()
    out = randaugment_image(x, key=sbrandom.key(seed), severity=severity, depth=depth)
    assert out.shape == x.shape and torch.equal(x, before)
    assert bool(((out >= 0) & (out <= 1)).all())
    expected = x
    for k in sbrandom.split(sbrandom.key(seed), depth) if depth else ():
        expected = augment_once(expected, key=k, severity=severity)
    assert torch.equal(out, expected)
    prefix = randaugment_image(x[:2], key=sbrandom.key(seed), severity=severity, depth=depth)
    torch.testing.assert_close(prefix, out[:2])


@common
@given(st.integers(0, 2**32), st.integers(1, 3))
def test_randaugment_zero_strength_is_the_identity(seed, depth):
    x = _images(seed)
    assert torch.equal(randaugment_image(x, key=sbrandom.key(seed), depth=0), x)
    out = randaugment_image(
        x, key=sbrandom.key(seed), severity=0, depth=depth, augmentation_set=LEVEL_DRIVEN
    )
    torch.testing.assert_close(out, x, atol=1e-5, rtol=0)


def test_randaugment_single_image_and_a_one_primitive_set():
    x = _images(0)[0]
    out = randaugment_image(x, key=sbrandom.key(0), depth=3, augmentation_set=["autocontrast"])
    torch.testing.assert_close(out, _autocontrast(x.unsqueeze(0))[0])  # idempotent


@pytest.mark.parametrize(
    ("kwargs", "exc", "msg"),
    [
        ({"depth": -1}, ValueError, "depth"),
        ({"severity": -1}, ValueError, "severity"),
        ({"augmentation_set": ["blur"]}, ValueError, "augmentation_set"),
    ],
)
def test_randaugment_errors(kwargs, exc, msg):
    with pytest.raises(exc, match=msg):
        randaugment_image(_images(0), key=sbrandom.key(0), **kwargs)
    with pytest.raises(exc, match=msg):
        RandAugment(**kwargs)


def test_randaugment_algorithm_augments_the_input_from_the_state_key():
    ra = RandAugment(severity=9, depth=2)
    batch = (_images(2), torch.arange(4))
    state = sbfunc.Context(sbrandom.key(5), batch=batch)
    out = ra.apply(sbfunc.Event.AFTER_DATALOADER, state)
    assert torch.equal(out.batch[0], randaugment_image(batch[0], key=state.key))
    other = ra.apply(sbfunc.Event.AFTER_DATALOADER, state.replace(key=sbrandom.key(6)))
    assert not torch.equal(out.batch[0], other.batch[0])
    assert ra.match(sbfunc.Event.AFTER_DATALOADER, state)
    assert not ra.match(sbfunc.Event.FIT_START, state)
