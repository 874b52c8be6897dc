import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from sbfunc import random as sbrandom
from tests.random.helpers import SETTINGS, ks_bound, ks_statistic

K0 = sbrandom.key(0)

# Reference values from jax 0.10.2 (jax.random, default jax_threefry_partitionable=True; the
# float64 draw with jax_enable_x64). Floats are compared through their bit patterns.
JAX_BITS_0 = [4070199207, 4202968722, 1427181096, 2012915765, 2447653815, 710830403]
JAX_BITS_42_2x3 = [[2098992034, 2919706841, 2646866425], [2409546199, 1935504149, 2516274904]]
JAX_UNIFORM_0 = [1064475214, 1064993846, 1051337244, 1055913296, 1058137146, 1042905504]
JAX_UNIFORM_1_2x3 = [[1054905456, 1057530888, 1055149928], [1054897532, 1063631250, 1057953558]]
JAX_UNIFORM_3_MINUS2_5 = [-1078090210, 1083319539, 1076018069, 1083869698]  # int32 view
JAX_UNIFORM64_0 = [4601209873087491728, 4596960885320641928, 4606870062290452936]
JAX_UNIFORM16_0 = [13560, 13008, 11008, 14656]
JAX_UNIFORM_BF16_0 = [16166, 16146, 15904, 15952]
JAX_NORMAL_0 = [1.622642159461975, 2.0252647399902344, -0.4335944354534149, -0.07861734926700592]
JAX_GUMBEL_0 = [2.923372507095337, 3.83261775970459, -0.09689324349164963, 0.2772570848464966]
JAX_BERNOULLI_0_03 = [False, False, False, False, False, True, False, False]


def test_bits_match_jax():
    assert sbrandom.bits(K0, (6,)).tolist() == JAX_BITS_0
    assert sbrandom.bits(sbrandom.key(42), (2, 3)).tolist() == JAX_BITS_42_2x3


def test_uniform_matches_jax_bit_for_bit():
    assert sbrandom.uniform(K0, 6).view(torch.int32).tolist() == JAX_UNIFORM_0
    u = sbrandom.uniform(sbrandom.key(1), (2, 3))
    assert u.view(torch.int32).tolist() == JAX_UNIFORM_1_2x3
    scaled = sbrandom.uniform(sbrandom.key(3), 4, minval=-2.0, maxval=5.0)
    assert scaled.view(torch.int32).tolist() == JAX_UNIFORM_3_MINUS2_5
    u64 = sbrandom.uniform(K0, 3, dtype=torch.float64)
    assert u64.view(torch.int64).tolist() == JAX_UNIFORM64_0
    assert sbrandom.uniform(K0, 4, dtype=torch.float16).view(torch.int16).tolist() == (
        JAX_UNIFORM16_0
    )
    assert sbrandom.uniform(K0, 4, dtype=torch.bfloat16).view(torch.int16).tolist() == (
        JAX_UNIFORM_BF16_0
    )


def test_normal_gumbel_bernoulli_match_jax():
    torch.testing.assert_close(
        sbrandom.normal(K0, 4), torch.tensor(JAX_NORMAL_0), rtol=1e-5, atol=1e-6
    )
    torch.testing.assert_close(
        sbrandom.gumbel(K0, 4), torch.tensor(JAX_GUMBEL_0), rtol=1e-6, atol=1e-6
    )
    assert sbrandom.bernoulli(K0, 0.3, 8).tolist() == JAX_BERNOULLI_0_03


@SETTINGS
@given(st.integers(0, 2**40), st.lists(st.integers(0, 5), max_size=3))
def test_uniform_unit_grid_range_and_dtypes(seed, shape):
    k = sbrandom.key(seed)
    for dtype, mantissa in ((torch.float32, 23), (torch.float64, 52), (torch.float16, 10)):
        u = sbrandom.uniform(k, shape, dtype=dtype)
        assert u.dtype == dtype and u.shape == tuple(shape)
        assert ((u >= 0) & (u < 1)).all()
        grid = u.double() * 2.0**mantissa
        assert torch.equal(grid, grid.floor())  # exactly j * 2**-mantissa
    b = sbrandom.bits(k, shape)
    assert b.dtype == torch.int64 and ((b >= 0) & (b < 2**32)).all()


@SETTINGS
@given(
    st.integers(0, 1000),
    st.floats(-1e6, 1e6, allow_subnormal=False),
    st.floats(1e-3, 1e6),
)
def test_uniform_stays_in_half_open_range(seed, minval, width):
    maxval = minval + width
    lo, hi = torch.tensor(minval), torch.tensor(maxval)  # the bounds as float32
    if hi <= lo:
        with pytest.raises(ValueError, match="empty range"):
            sbrandom.uniform(sbrandom.key(seed), 1, minval=minval, maxval=maxval)
        return
    u = sbrandom.uniform(sbrandom.key(seed), 256, minval=minval, maxval=maxval)
    assert ((u >= lo) & (u < hi)).all()


def test_uniform_never_returns_maxval_when_rounding_would():
    # 1 - 2**-23 scaled into [0, 1 + 2**-23) rounds to maxval in float32; it is clamped below.
    u = sbrandom.uniform(K0, 50_000, minval=1.0, maxval=1.0 + 2**-23)
    assert (u < 1.0 + 2**-23).all() and (u >= 1.0).all()


def test_noise_lives_on_the_requested_device():
    k = sbrandom.key(0)
    assert sbrandom.uniform(k, (2, 3), device="meta").device.type == "meta"
    assert sbrandom.normal(k.to("meta"), 4).device.type == "meta"
    assert sbrandom.bernoulli(k, torch.full((3,), 0.5, device="meta")).device.type == "meta"


def test_uniform_is_ks_uniform_and_halves_are_uncorrelated():
    u = sbrandom.uniform(sbrandom.key(5), 200_000, dtype=torch.float64)
    assert ks_statistic(u, lambda x: x) < ks_bound(u.numel())
    a, b = sbrandom.split(sbrandom.key(5))
    ua, ub = sbrandom.uniform(a, 100_000), sbrandom.uniform(b, 100_000)
    assert abs(torch.corrcoef(torch.stack([ua, ub]))[0, 1]) < 0.02
    lag = torch.corrcoef(torch.stack([ua[:-1], ua[1:]]))[0, 1]
    assert abs(lag) < 0.02


def test_bits_are_balanced():
    b = sbrandom.bits(sbrandom.key(8), 100_000)
    ones = torch.stack([(b >> i) & 1 for i in range(32)]).double().mean(1)
    assert ((ones - 0.5).abs() < 0.01).all()


def test_normal_is_ks_normal():
    z = sbrandom.normal(sbrandom.key(6), 200_000, dtype=torch.float64)
    assert torch.isfinite(z).all()
    cdf = lambda x: 0.5 * (1 + torch.erf(x / math.sqrt(2)))  # noqa: E731
    assert ks_statistic(z, cdf) < ks_bound(z.numel())
    assert abs(z.mean()) < 0.01 and abs(z.var() - 1) < 0.02


def test_gumbel_moments_and_from_uniform():
    g = sbrandom.gumbel(sbrandom.key(0), 200_000, dtype=torch.float64)
    assert abs(g.mean() - 0.5772) < 0.01  # Euler-Mascheroni
    assert abs(g.var() - math.pi**2 / 6) < 0.03
    u = torch.tensor([0.0, 0.5])
    assert torch.isfinite(sbrandom.gumbel_from_uniform(u)).all()


@SETTINGS
@given(st.integers(0, 10_000), st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]))
def test_bernoulli_float_rate_and_edges(seed, p):
    b = sbrandom.bernoulli(sbrandom.key(seed), p, (20_000,))
    assert b.dtype == torch.bool
    if p in (0.0, 1.0):
        assert bool(b.all()) == (p == 1.0) and bool(b.any()) == (p == 1.0)
    else:
        assert abs(b.double().mean() - p) < 0.02


def test_bernoulli_tensor_probabilities_broadcast():
    p = torch.tensor([0.0, 0.25, 1.0], dtype=torch.float64)
    b = sbrandom.bernoulli(sbrandom.key(1), p, (40_000, 3))
    assert b.shape == (40_000, 3)
    assert torch.allclose(b.double().mean(0), p, atol=0.01)
    assert sbrandom.bernoulli(sbrandom.key(1), p).shape == (3,)


def test_noise_does_not_touch_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    sbrandom.gumbel(sbrandom.key(5), (10,))
    sbrandom.normal(sbrandom.key(5), (10,))
    assert torch.equal(torch.rand(3), expected)


def test_same_key_same_noise_different_key_different_noise():
    a, b = sbrandom.split(sbrandom.key(0))
    assert torch.equal(sbrandom.normal(a, 100), sbrandom.normal(a, 100))
    assert not torch.equal(sbrandom.uniform(a, 100), sbrandom.uniform(b, 100))


def test_prefix_property_of_the_counter_design():
    # Element i depends only on the key and i: a longer draw extends a shorter one.
    k = sbrandom.key(4)
    assert torch.equal(sbrandom.bits(k, 10)[:4], sbrandom.bits(k, 4))
    assert torch.equal(sbrandom.uniform(k, (2, 5)).flatten(), sbrandom.uniform(k, 10))


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: sbrandom.uniform(K0, -1), ValueError, "shape must have non-negative sizes"),
        (lambda: sbrandom.uniform(K0, "3"), TypeError, "shape must be an int or a sequence"),
        (lambda: sbrandom.uniform(K0, 3, dtype=torch.int32), TypeError, "floating-point"),
        (lambda: sbrandom.uniform(K0, 3, minval=1.0, maxval=1.0), ValueError, "maxval must be >"),
        (lambda: sbrandom.uniform(K0, 3, minval=1.0, maxval=1 + 1e-9), ValueError, "empty range"),
        (
            lambda: sbrandom.uniform(K0, 3, maxval=math.inf),
            ValueError,
            "maxval must be a finite float",
        ),
        (lambda: sbrandom.bernoulli(K0, 1.5), ValueError, r"p must be in \[0, 1\], got 1.5"),
        (lambda: sbrandom.bernoulli(K0, "x"), TypeError, "p must be a float"),
        (lambda: sbrandom.normal(torch.tensor(0), 3), TypeError, "k must be an int64 tensor"),
    ],
)
def test_argument_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()
