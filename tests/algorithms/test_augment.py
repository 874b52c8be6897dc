import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc import random as sbrandom

common = settings(max_examples=40, deadline=None, derandomize=True, database=None)


@common
@given(
    st.integers(0, 2**32),
    st.integers(1, 3),
    st.sampled_from([0.25, 0.5, 1.0]),
    st.sampled_from([(8,), (6, 10), (4, 4, 4)]),
)
def test_cutout_masks_same_square_in_every_channel(seed, holes, length, spatial):
    x = torch.randn(5, 3, *spatial) + 10  # never zero by chance
    before = x.clone()
    out = sbfunc.cutout_batch(x, key=sbrandom.key(seed), num_holes=holes, length=length)
    assert torch.equal(x, before)
    zero = out == 0
    assert torch.equal(zero[:, 0], zero[:, 1]) and torch.equal(zero[:, 0], zero[:, 2])
    side = max(1, round(length * min(spatial)))
    per_sample = zero[:, 0].flatten(1).sum(1)
    assert bool((per_sample > 0).all()) and bool(
        (per_sample <= holes * side ** len(spatial)).all()
    )
    kept = ~zero
    assert torch.equal(out[kept], x[kept])
    again = sbfunc.cutout_batch(x, key=sbrandom.key(seed), num_holes=holes, length=length)
    assert torch.equal(out, again)


@pytest.mark.parametrize(
    ("kwargs", "exc", "msg"),
    [
        ({"num_holes": 0}, ValueError, "num_holes must be an int >= 1"),
        ({"length": 0.0}, ValueError, r"length must be in \(0, 1\]"),
        ({"length": 2.0}, ValueError, r"length must be in \(0, 1\]"),
        ({"length": "x"}, TypeError, "length must be a finite float"),
    ],
)
def test_cutout_errors(kwargs, exc, msg):
    with pytest.raises(exc, match=msg):
        sbfunc.cutout_batch(torch.ones(1, 1, 4, 4), key=sbrandom.key(0), **kwargs)


def test_cutout_rank():
    with pytest.raises(ValueError, match="rank 3-5"):
        sbfunc.cutout_batch(torch.ones(2, 4), key=sbrandom.key(0))


@common
@given(st.integers(0, 2**32), st.sampled_from([0.2, 1.0, 4.0]))
def test_mixup_is_a_convex_pairing(seed, alpha):
    x, y = torch.randn(6, 3), torch.randint(0, 4, (6,))
    xm, ym, lam = sbfunc.mixup_batch(x, y, key=sbrandom.key(seed), alpha=alpha, num_classes=4)
    assert 0 <= float(lam) <= 1
    torch.testing.assert_close(ym.sum(1), torch.ones(6))
    xm2, ym2, lam2 = sbfunc.mixup_batch(x, y, key=sbrandom.key(seed), alpha=alpha, num_classes=4)
    assert torch.equal(xm, xm2) and torch.equal(ym, ym2) and torch.equal(lam, lam2)
    # Every mixed row is lam * x_i + (1 - lam) * x_j for one partner j.
    partner = (xm - lam * x) / (1 - lam) if float(lam) < 1 - 1e-6 else None
    if partner is not None and float(1 - lam) > 1e-3:
        dists = torch.cdist(partner, x)
        assert bool((dists.min(1).values < 1e-3).all())


def test_mixup_lambda_mean_is_half():
    lams = torch.stack(
        [
            sbfunc.mixup_batch(
                torch.ones(2, 1), torch.zeros(2, dtype=torch.long), key=k, alpha=0.4, num_classes=2
            )[2]
            for k in sbrandom.split(sbrandom.key(0), 2000)
        ]
    )
    assert abs(float(lams.mean()) - 0.5) < 0.03


def test_mixup_errors():
    with pytest.raises(ValueError, match="alpha must be a float > 0"):
        sbfunc.mixup_batch(
            torch.ones(2), torch.zeros(2), key=sbrandom.key(0), alpha=0, num_classes=2
        )
    with pytest.raises(ValueError, match="num_classes must be an int >= 1"):
        sbfunc.mixup_batch(torch.ones(2), torch.zeros(2), key=sbrandom.key(0), num_classes=0)


def test_label_smoothing():
    out = sbfunc.smooth_labels(torch.tensor([0, 2]), 0.3, 3)
    torch.testing.assert_close(out.sum(1), torch.ones(2))
    assert float(out[0, 0]) == pytest.approx(0.8)
    with pytest.raises(ValueError, match=r"smoothing must be in \[0, 1\]"):
        sbfunc.smooth_labels(torch.tensor([0]), 1.5, 2)
