import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from sbfunc import random as sbrandom
from tests.random.helpers import SETTINGS

K0 = sbrandom.key(0)
N = 100_000


@pytest.mark.parametrize("alpha", [0.05, 0.2, 0.7, 1.0, 2.5, 30.0])
def test_gamma_mean_and_variance(alpha):
    g = sbrandom.gamma(sbrandom.key(1), alpha, (N,), dtype=torch.float64)
    assert (g >= 0).all() and torch.isfinite(g).all()
    # Gamma(alpha, 1): mean = variance = alpha; 6 standard errors (var of the variance: ~6a^2).
    assert abs(g.mean() - alpha) < 6 * (alpha / N) ** 0.5
    assert abs(g.var() - alpha) < 6 * ((2 * alpha**2 + 6 * alpha) / N) ** 0.5 + 1e-3


@pytest.mark.parametrize(("a", "b"), [(0.2, 0.2), (2.0, 5.0), (0.5, 3.0), (1.0, 1.0)])
def test_beta_mean_and_variance(a, b):
    x = sbrandom.beta(sbrandom.key(2), a, b, (N,), dtype=torch.float64)
    assert ((x >= 0) & (x <= 1)).all()
    mean, var = a / (a + b), a * b / ((a + b) ** 2 * (a + b + 1))
    assert abs(x.mean() - mean) < 6 * (var / N) ** 0.5
    assert abs(x.var() - var) < 0.05 * var


def test_tiny_shapes_stay_finite():
    x = sbrandom.beta(K0, 1e-3, 1e-3, (10_000,))
    assert torch.isfinite(x).all() and ((x >= 0) & (x <= 1)).all()
    assert torch.isfinite(sbrandom.gamma(K0, 1e-3, (10_000,))).all()


def test_tensor_parameters_broadcast_per_element():
    alpha = torch.tensor([0.5, 3.0], dtype=torch.float64)
    g = sbrandom.gamma(sbrandom.key(3), alpha, (N, 2))
    assert g.shape == (N, 2) and g.dtype == torch.float32
    assert torch.allclose(g.double().mean(0), alpha, rtol=0.03)
    assert sbrandom.gamma(K0, alpha).shape == (2,)
    ab = sbrandom.beta(K0, torch.tensor([1.0, 2.0]), 3.0)
    assert ab.shape == (2,)


@SETTINGS
@given(st.integers(0, 2**40), st.floats(0.01, 50.0), st.lists(st.integers(0, 4), max_size=2))
def test_gamma_is_deterministic_with_static_shape(seed, alpha, shape):
    k = sbrandom.key(seed)
    g = sbrandom.gamma(k, alpha, shape)
    assert g.shape == tuple(shape) and torch.equal(g, sbrandom.gamma(k, alpha, shape))
    assert (g >= 0).all()


def test_gamma_and_beta_follow_the_device_of_tensor_parameters():
    alpha = torch.ones(3, device="meta")
    assert sbrandom.gamma(K0, alpha).device.type == "meta"
    assert sbrandom.beta(K0, 1.0, 1.0, (2,), device="meta").device.type == "meta"


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: sbrandom.gamma(K0, 0.0), ValueError, "alpha must be a positive finite float"),
        (lambda: sbrandom.gamma(K0, "1"), TypeError, "alpha must be a float or a tensor"),
        (lambda: sbrandom.beta(K0, 1.0, -1.0), ValueError, "b must be a positive"),
        (lambda: sbrandom.gamma(K0, 1.0, dtype=torch.int64), TypeError, "floating-point"),
        (lambda: sbrandom.gamma(torch.zeros(2), 1.0), TypeError, "k must be an int64 tensor"),
    ],
)
def test_argument_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()
