import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from sbfunc import random as sbrandom
from tests.random.helpers import SETTINGS

K0 = sbrandom.key(0)

# Reference values from jax 0.10.2 (jax.random; int32 randint, jax_enable_x64 off).
JAX_RANDINT = [
    (0, (8,), 0, 10, [9, 0, 2, 3, 1, 7, 2, 3]),
    (11, (6,), 3, 7, [4, 6, 3, 3, 6, 3]),
    (5, (6,), -7, 1_000_003, [972084, 453577, 522652, 331447, 369233, 262342]),
    (5, (4,), -(2**31), 2**31 - 1, [-1787507967, -1163020224, -1664956169, -994140664]),
]
JAX_PERMUTATION_0_10 = [0, 1, 8, 5, 6, 4, 3, 2, 7, 9]
JAX_PERMUTATION_1_3000_HEAD = [36, 2724, 673, 590, 2744, 1042, 1000, 537]  # two sort rounds


def test_randint_matches_jax():
    for seed, shape, low, high, expected in JAX_RANDINT:
        assert sbrandom.randint(sbrandom.key(seed), shape, low, high).tolist() == expected


def test_permutation_matches_jax():
    assert sbrandom.permutation(K0, 10).tolist() == JAX_PERMUTATION_0_10
    head = sbrandom.permutation(sbrandom.key(1), 3000)[:8].tolist()
    assert head == JAX_PERMUTATION_1_3000_HEAD
    assert sbrandom.permutation(sbrandom.key(2), 2).tolist() == [1, 0]
    assert sbrandom.permutation(sbrandom.key(2), 1).tolist() == [0]


@SETTINGS
@given(
    st.integers(0, 2**32),
    st.integers(-(2**62), 2**62),
    st.integers(1, 2**32),
    st.lists(st.integers(0, 4), max_size=2),
)
def test_randint_range_shape_and_dtype(seed, low, span, shape):
    r = sbrandom.randint(sbrandom.key(seed), shape, low, low + span)
    assert r.dtype == torch.int64 and r.shape == tuple(shape)
    assert ((r >= low) & (r < low + span)).all()


def test_randint_counts_are_uniform():
    r = sbrandom.randint(sbrandom.key(3), 60_000, -3, 3)
    counts = torch.bincount(r + 3, minlength=6).double()
    assert ((counts / 10_000 - 1).abs() < 0.05).all()


@SETTINGS
@given(st.integers(0, 2**40), st.integers(0, 3000))
def test_permutation_is_a_permutation(seed, n):
    p = sbrandom.permutation(sbrandom.key(seed), n)
    assert p.dtype == torch.int64 and p.shape == (n,)
    assert torch.equal(torch.sort(p).values, torch.arange(n))


def test_permutation_positions_are_uniform():
    firsts = torch.stack([sbrandom.permutation(sbrandom.fold_in(K0, i), 4) for i in range(4000)])
    freq = torch.stack([torch.bincount(firsts[:, j], minlength=4) for j in range(4)]).double()
    assert ((freq / 1000 - 1).abs() < 0.12).all()


@SETTINGS
@given(
    st.integers(0, 2**32),
    st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.0]), min_size=1, max_size=6),
    st.integers(0, 50),
)
def test_categorical_shape_range_and_zero_weights(seed, weights, num):
    probs = torch.tensor(weights)
    if probs.sum() == 0:
        probs[-1] = 1.0
    draws = sbrandom.categorical(sbrandom.key(seed), probs, num)
    assert draws.dtype == torch.int64 and draws.shape == (num,)
    assert ((draws >= 0) & (draws < len(weights))).all()
    assert (probs[draws] > 0).all()


def test_categorical_frequencies_follow_the_weights():
    probs = torch.tensor([1.0, 0.0, 2.0, 7.0], dtype=torch.float64)
    draws = sbrandom.categorical(sbrandom.key(4), probs, 100_000)
    freq = torch.bincount(draws, minlength=4).double() / 100_000
    assert torch.allclose(freq, probs / probs.sum(), atol=0.006)
    assert freq[1] == 0


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (
            lambda: sbrandom.randint(K0, 3, 5, 5),
            ValueError,
            r"high - low must be in \[1, 2\*\*32\]",
        ),
        (lambda: sbrandom.randint(K0, 3, 0, 2**32 + 1), ValueError, "high - low"),
        (lambda: sbrandom.randint(K0, 3, 0.0, 2), TypeError, "low must be an int"),
        (lambda: sbrandom.permutation(K0, -1), ValueError, "n must be an int >= 0, got -1"),
        (lambda: sbrandom.permutation(K0, 2.0), TypeError, "n must be an int"),
        (lambda: sbrandom.categorical(K0, torch.ones(2, 2), 3), ValueError, "1-D"),
        (
            lambda: sbrandom.categorical(K0, torch.ones(2, dtype=torch.int64), 3),
            TypeError,
            "float",
        ),
        (lambda: sbrandom.categorical(K0, torch.ones(2), -1), ValueError, "num_samples must be"),
    ],
)
def test_argument_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()
