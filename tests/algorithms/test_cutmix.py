import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc import random as sbrandom
from sbfunc.algorithms import CutMix, cutmix_batch

common = settings(max_examples=30, deadline=None, derandomize=True, database=None)


def _box_mask(box, h, w):
    top, left, bottom, right = box.tolist()
    mask = torch.zeros(h, w, dtype=torch.bool)
    mask[top:bottom, left:right] = True
    return mask


def _partners(x, out, mask):
    """For each row, the index of the image its box content came from."""
    if not mask.any():
        return None
    inside = out[..., mask].flatten(1)
    sources = x[..., mask].flatten(1)
    return torch.cdist(inside, sources).argmin(1)


@common
@given(
    st.integers(0, 2**32),
    st.sampled_from([0.0, 0.3, 1.0, 4.0]),
    st.booleans(),
    st.sampled_from([(8, 8), (6, 10)]),
)
def test_cutmix_pastes_one_box_of_a_partner_and_mixes_labels_by_area(seed, alpha, uniform, hw):
    h, w = hw
    x = sbrandom.uniform(sbrandom.key(seed), (6, 2, h, w)) + torch.arange(6.0).view(6, 1, 1, 1)
    y = torch.arange(6) % 4
    before = x.clone()
    kw = {"alpha": alpha, "num_classes": 4, "uniform_sampling": uniform}
    xm, ym, area, box = cutmix_batch(x, y, key=sbrandom.key(seed), **kw)
    assert torch.equal(x, before) and xm.shape == x.shape and ym.shape == (6, 4)
    mask = _box_mask(box, h, w)
    assert torch.equal(xm[..., ~mask], x[..., ~mask])  # outside the box: unchanged
    torch.testing.assert_close(area, torch.tensor(1 - mask.float().mean().item()))
    torch.testing.assert_close(ym.sum(1), torch.ones(6))  # label mass preserved
    partner = _partners(x, xm, mask)
    if partner is not None:
        assert torch.equal(xm[..., mask], x[partner][..., mask])  # one partner per image
        onehot = sbfunc.algorithms.soft_targets(y, 4)
        torch.testing.assert_close(ym, area * onehot + (1 - area) * onehot[partner])
    again = cutmix_batch(x, y, key=sbrandom.key(seed), **kw)
    assert all(torch.equal(a, b) for a, b in zip((xm, ym, area, box), again, strict=True))


@common
@given(st.integers(0, 2**32), st.booleans())
def test_cutmix_per_pixel_targets_follow_the_pixels(seed, soft):
    x = sbrandom.uniform(sbrandom.key(seed), (5, 3, 8, 8)) + torch.arange(5.0).view(5, 1, 1, 1)
    y = sbrandom.randint(sbrandom.key(seed + 1), (5, 8, 8), 0, 3)
    target = sbfunc.algorithms.soft_targets(y, 3) if soft else y  # [N, C, H, W] or [N, H, W]
    xm, ym, _, box = cutmix_batch(x, target, key=sbrandom.key(seed), alpha=1.0)
    assert ym.shape == target.shape and ym.dtype == target.dtype
    mask = _box_mask(box, 8, 8)
    partner = _partners(x, xm, mask)
    expected = target.clone()
    if partner is not None:
        expected[..., mask] = target[partner][..., mask]
    assert torch.equal(ym, expected)
    if soft:
        torch.testing.assert_close(ym.sum(1), torch.ones(5, 8, 8))


def test_cutmix_zero_length_is_the_identity():
    x, y = torch.rand(4, 3, 8, 8), torch.tensor([0, 1, 2, 3])
    xm, ym, area, box = cutmix_batch(x, y, key=sbrandom.key(0), length=0.0, num_classes=4)
    assert torch.equal(xm, x) and float(area) == 1.0
    assert torch.equal(ym, sbfunc.algorithms.soft_targets(y, 4))
    xm, _, area, box = cutmix_batch(x, y, key=sbrandom.key(0), length=0.5, num_classes=4)
    assert (box[2] - box[0]) <= 4 and (box[3] - box[1]) <= 4 and float(area) >= 0.75


def test_cutmix_uniform_sampling_mixes_every_pixel_equally_often():
    x, y = torch.zeros(2, 1, 8, 8), torch.zeros(2, dtype=torch.long)
    counts = torch.zeros(8, 8)
    for k in sbrandom.split(sbrandom.key(0), 1500):
        box = cutmix_batch(x, y, key=k, length=0.5, uniform_sampling=True, num_classes=1)[3]
        counts += _box_mask(box, 8, 8)
    freq = counts / 1500
    expected = (4 / 11) ** 2  # side / (size + side - 1) on each axis
    assert float((freq - expected).abs().max()) < 0.05


@pytest.mark.parametrize(
    ("args", "kwargs", "exc", "msg"),
    [
        ((torch.rand(2, 8, 8), torch.zeros(2)), {}, ValueError, r"\[N, C, H, W\]"),
        (
            (torch.rand(2, 1, 8, 8), torch.zeros(2, dtype=torch.long)),
            {},
            ValueError,
            "num_classes",
        ),
        ((torch.rand(2, 1, 4, 4), torch.rand(2, 3)), {"alpha": -1}, ValueError, "alpha"),
        ((torch.rand(2, 1, 4, 4), torch.rand(2, 3)), {"length": 1.5}, ValueError, "length"),
        (
            (torch.rand(2, 1, 4, 4), torch.rand(2, 3)),
            {"uniform_sampling": 0},
            TypeError,
            "uniform",
        ),
    ],
)
def test_cutmix_errors(args, kwargs, exc, msg):
    with pytest.raises(exc, match=msg):
        cutmix_batch(*args, key=sbrandom.key(0), **kwargs)


def test_cutmix_algorithm_draws_from_the_state_key_on_before_forward():
    cm = CutMix(alpha=1.0, num_classes=3, input="image", target="label")
    batch = {"image": torch.rand(6, 3, 8, 8), "label": torch.tensor([0, 1, 2, 0, 1, 2])}
    state = sbfunc.Context(sbrandom.key(2), batch=batch)
    out = cm.apply(sbfunc.Event.BEFORE_FORWARD, state)
    xm, ym, _, _ = cutmix_batch(batch["image"], batch["label"], key=state.key, num_classes=3)
    assert torch.equal(out.batch["image"], xm) and torch.equal(out.batch["label"], ym)
    assert cm.match(sbfunc.Event.BEFORE_FORWARD, state)
    assert not cm.match(sbfunc.Event.AFTER_DATALOADER, state)
    assert cm.interpolate_loss and state.batch is batch


@pytest.mark.parametrize(
    ("kwargs", "exc"),
    [({"alpha": -0.5}, ValueError), ({"num_classes": 0}, ValueError), ({"input": 1.5}, TypeError)],
)
def test_cutmix_validates_at_construction(kwargs, exc):
    with pytest.raises(exc):
        CutMix(**kwargs)
