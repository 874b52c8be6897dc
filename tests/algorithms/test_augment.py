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
    st.booleans(),
)
def test_cutout_masks_same_square_in_every_channel(seed, holes, length, spatial, uniform):
    x = torch.randn(5, 3, *spatial) + 10  # never zero by chance
    before = x.clone()
    kw = {"num_holes": holes, "length": length, "uniform_sampling": uniform}
    out = sbfunc.algorithms.cutout_batch(x, key=sbrandom.key(seed), **kw)
    assert torch.equal(x, before)
    zero = out == 0
    assert torch.equal(zero[:, 0], zero[:, 1]) and torch.equal(zero[:, 0], zero[:, 2])
    side = max(1, round(length * min(spatial)))
    per_sample = zero[:, 0].flatten(1).sum(1)
    if not uniform:  # the centre is inside the image: every square masks something
        assert bool((per_sample > 0).all())
    assert bool((per_sample <= holes * side ** len(spatial)).all())
    kept = ~zero
    assert torch.equal(out[kept], x[kept])
    again = sbfunc.algorithms.cutout_batch(x, key=sbrandom.key(seed), **kw)
    assert torch.equal(out, again)


def test_cutout_uniform_sampling_masks_every_pixel_equally_often():
    n, size, side = 6000, 8, 4  # 1-D images: pixel masked with probability side/(size+side-1)
    x = torch.ones(n, 1, size)
    uniform = sbfunc.algorithms.cutout_batch(
        x, key=sbrandom.key(3), length=0.5, uniform_sampling=True
    )
    freq = (uniform == 0).float().mean(0).flatten()
    expected = side / (size + side - 1)
    assert float((freq - expected).abs().max()) < 0.03
    centred = sbfunc.algorithms.cutout_batch(x, key=sbrandom.key(3), length=0.5)
    edge, middle = (centred == 0).float().mean(0).flatten()[[size - 1, size // 2]]
    assert float(edge) < float(middle) - 0.15  # the paper's sampling favours the centre


@pytest.mark.parametrize(
    ("kwargs", "exc", "msg"),
    [
        ({"num_holes": 0}, ValueError, "num_holes must be an int >= 1"),
        ({"length": 0.0}, ValueError, r"length must be in \(0, 1\]"),
        ({"length": 2.0}, ValueError, r"length must be in \(0, 1\]"),
        ({"length": "x"}, TypeError, r"length must be a float in \(0, 1\]"),
        ({"uniform_sampling": 1}, TypeError, "uniform_sampling must be True or False"),
    ],
)
def test_cutout_errors(kwargs, exc, msg):
    with pytest.raises(exc, match=msg):
        sbfunc.algorithms.cutout_batch(torch.ones(1, 1, 4, 4), key=sbrandom.key(0), **kwargs)


def test_cutout_rank():
    with pytest.raises(ValueError, match="rank 3-5"):
        sbfunc.algorithms.cutout_batch(torch.ones(2, 4), key=sbrandom.key(0))


@common
@given(st.integers(0, 2**32), st.sampled_from([0.2, 1.0, 4.0]))
def test_mixup_is_a_convex_pairing_dominated_by_the_original(seed, alpha):
    x, y = torch.randn(6, 3), torch.randint(0, 4, (6,))
    xm, ym, mixing = sbfunc.algorithms.mixup_batch(
        x, y, key=sbrandom.key(seed), alpha=alpha, num_classes=4
    )
    assert 0 <= float(mixing) <= 0.5  # Composer's min(z, 1 - z): the original row dominates
    torch.testing.assert_close(ym.sum(1), torch.ones(6))  # label mass preserved
    assert bool((ym.max(1).values >= 0.5).all())
    xm2, ym2, m2 = sbfunc.algorithms.mixup_batch(
        x, y, key=sbrandom.key(seed), alpha=alpha, num_classes=4
    )
    assert torch.equal(xm, xm2) and torch.equal(ym, ym2) and torch.equal(mixing, m2)
    # Every mixed row is (1 - mixing) * x_i + mixing * x_j for one partner j.
    if float(mixing) > 1e-3:
        partner = (xm - (1 - mixing) * x) / mixing
        assert bool((torch.cdist(partner, x).min(1).values < 1e-3).all())


def test_mixup_coefficient_is_min_of_a_beta_draw_and_its_complement():
    mixings = torch.stack(
        [
            sbfunc.algorithms.mixup_batch(
                torch.ones(2, 1), torch.zeros(2, dtype=torch.long), key=k, alpha=1.0, num_classes=2
            )[2]
            for k in sbrandom.split(sbrandom.key(0), 2000)
        ]
    )
    # Beta(1, 1) is uniform, so min(z, 1 - z) is uniform on [0, 0.5]: mean 1/4.
    assert float(mixings.max()) <= 0.5 and abs(float(mixings.mean()) - 0.25) < 0.02


def test_mixup_alpha_zero_is_the_identity():
    x, y = torch.randn(5, 3), torch.tensor([0, 1, 2, 0, 1])
    xm, ym, mixing = sbfunc.algorithms.mixup_batch(
        x, y, key=sbrandom.key(0), alpha=0, num_classes=3
    )
    assert float(mixing) == 0 and torch.equal(xm, x)
    assert torch.equal(ym, sbfunc.algorithms.soft_targets(y, 3))


@common
@given(st.integers(0, 2**32))
def test_mixup_per_pixel_targets_get_the_class_axis_second(seed):
    x, y = torch.rand(3, 2, 4, 5), torch.randint(0, 3, (3, 4, 5))
    _, ym, _ = sbfunc.algorithms.mixup_batch(
        x, y, key=sbrandom.key(seed), alpha=1.0, num_classes=3
    )
    assert ym.shape == (3, 3, 4, 5)
    torch.testing.assert_close(ym.sum(1), torch.ones(3, 4, 5))


def test_mixup_errors():
    with pytest.raises(ValueError, match="alpha must be a finite float >= 0"):
        sbfunc.algorithms.mixup_batch(
            torch.ones(2), torch.zeros(2), key=sbrandom.key(0), alpha=-1, num_classes=2
        )
    with pytest.raises(ValueError, match="num_classes must be an int >= 1"):
        sbfunc.algorithms.mixup_batch(
            torch.ones(2), torch.zeros(2), key=sbrandom.key(0), num_classes=0
        )


def test_soft_targets_class_axis_second_and_ignored_labels():
    y = torch.tensor([[0, 2], [-1, 1]])  # two samples of two positions each
    out = sbfunc.algorithms.soft_targets(y, 3)
    assert out.shape == (2, 3, 2)
    assert out[:, :, 0].tolist() == [[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]  # -1: no class
    assert torch.equal(out.argmax(1)[0], y[0])
    soft = torch.rand(2, 3)
    assert sbfunc.algorithms.soft_targets(soft, 3) is soft
    with pytest.raises(ValueError, match="num_classes"):
        sbfunc.algorithms.soft_targets(y, 0)


def test_label_smoothing():
    out = sbfunc.algorithms.smooth_labels(torch.tensor([0, 2]), 0.3, 3)
    torch.testing.assert_close(out.sum(1), torch.ones(2))
    assert float(out[0, 0]) == pytest.approx(0.8)
    with pytest.raises(ValueError, match=r"smoothing must be in \[0, 1\]"):
        sbfunc.algorithms.smooth_labels(torch.tensor([0]), 1.5, 2)


@common
@given(st.integers(0, 2**32), st.sampled_from([0.0, 0.1, 1.0]))
def test_label_smoothing_per_pixel_keeps_the_class_axis_second(seed, smoothing):
    y = sbrandom.randint(sbrandom.key(seed), (2, 3, 4), 0, 5)
    out = sbfunc.algorithms.smooth_labels(y, smoothing, 5)
    assert out.shape == (2, 5, 3, 4)  # not (2, 3, 4, 5)
    torch.testing.assert_close(out.sum(1), torch.ones(2, 3, 4))  # label mass per pixel
    if smoothing == 0:
        assert torch.equal(out.argmax(1), y)  # identity at zero strength (as one-hot)
