import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sbfunc import random as sbrandom

seeds = st.integers(min_value=-(2**70), max_value=2**70)


@settings(max_examples=50, deadline=None, derandomize=True)
@given(seeds)
def test_key_is_deterministic_and_valid(seed):
    k = sbrandom.key(seed)
    assert sbrandom.is_key(k)
    assert torch.equal(k, sbrandom.key(seed))


@settings(max_examples=50, deadline=None, derandomize=True)
@given(seeds, st.integers(1, 8))
def test_split_gives_distinct_reproducible_keys(seed, num):
    k = sbrandom.key(seed)
    children = sbrandom.split(k, num)
    assert len(children) == num
    assert len({int(c) for c in children} | {int(k)}) == num + 1
    assert all(torch.equal(a, b) for a, b in zip(children, sbrandom.split(k, num), strict=True))


def test_split_does_not_mutate_parent():
    k = sbrandom.key(1)
    before = k.clone()
    sbrandom.split(k)
    sbrandom.uniform(k, (3,))
    assert torch.equal(k, before)


def test_same_key_same_noise_different_key_different_noise():
    a, b = sbrandom.split(sbrandom.key(0))
    assert torch.equal(sbrandom.uniform(a, (100,)), sbrandom.uniform(a, (100,)))
    assert not torch.equal(sbrandom.uniform(a, (100,)), sbrandom.uniform(b, (100,)))


def test_fold_in_distinguishes_data():
    k = sbrandom.key(0)
    assert len({int(sbrandom.fold_in(k, i)) for i in range(100)}) == 100


def test_noise_does_not_touch_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    sbrandom.gumbel(sbrandom.key(5), (10,))
    assert torch.equal(torch.rand(3), expected)


def test_gumbel_moments():
    g = sbrandom.gumbel(sbrandom.key(0), (200_000,), dtype=torch.float64)
    # Standard Gumbel: mean = Euler-Mascheroni constant, variance = pi^2 / 6.
    assert abs(g.mean() - 0.5772) < 0.01
    assert abs(g.var() - torch.pi**2 / 6) < 0.02


def test_key_checkpoints_with_weights_only(tmp_path):
    k = sbrandom.key(42)
    torch.save({"key": k}, tmp_path / "k.pt")
    loaded = torch.load(tmp_path / "k.pt", weights_only=True)["key"]
    assert torch.equal(loaded, k) and sbrandom.is_key(loaded)
    assert torch.equal(pickle.loads(pickle.dumps(k)), k)


@pytest.mark.parametrize(
    "bad", [3, torch.tensor([1, 2]), torch.tensor(1.0), torch.tensor(1, dtype=torch.int32)]
)
def test_invalid_keys_raise_type_error(bad):
    with pytest.raises(TypeError, match="key must be a 0-d int64 CPU tensor"):
        sbrandom.split(bad)


@pytest.mark.parametrize("num", [0, -1, 1.5, True])
def test_split_num_validated(num):
    with pytest.raises(ValueError, match="num must be an int >= 1"):
        sbrandom.split(sbrandom.key(0), num)


def test_key_seed_validated():
    with pytest.raises(TypeError, match="seed must be an int"):
        sbrandom.key(1.0)
