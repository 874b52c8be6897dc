import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc import random as sbrandom

KEYED = [sbfunc.rank_power, sbfunc.random_subset, sbfunc.top_k]
scores_st = st.lists(
    st.floats(-1e3, 1e3, allow_nan=False, allow_subnormal=False), min_size=1, max_size=64
)
keep_st = st.floats(0.01, 1.0)
seed_st = st.integers(0, 2**32)
common = settings(max_examples=60, deadline=None, derandomize=True, database=None)


@common
@given(scores_st, keep_st, seed_st, st.sampled_from(KEYED))
def test_indices_unique_sorted_in_range_with_kept_count(scores, keep, seed, rule):
    s = torch.tensor(scores)
    sel = rule(s, keep, key=sbrandom.key(seed))
    idx = sel.indices
    assert idx.dtype == torch.int64 and idx.dim() == 1
    assert idx.numel() == max(1, math.floor(keep * len(scores) + 1e-9))
    assert idx.numel() == sbfunc.kept_count(len(scores), keep)
    assert torch.all(idx[1:] > idx[:-1])
    assert idx.min() >= 0 and idx.max() < len(scores)
    assert sel.weights is None


@common
@given(scores_st, keep_st, seed_st, st.sampled_from(KEYED))
def test_same_key_same_selection(scores, keep, seed, rule):
    s = torch.tensor(scores)
    a = rule(s, keep, key=sbrandom.key(seed)).indices
    b = rule(s, keep, key=sbrandom.key(seed)).indices
    assert torch.equal(a, b)


@common
@given(scores_st, keep_st, seed_st, st.sampled_from([sbfunc.rank_power, sbfunc.top_k]))
def test_rank_only_rules_invariant_under_increasing_transforms(scores, keep, seed, rule):
    s = torch.tensor(scores, dtype=torch.float64)
    k = sbrandom.key(seed)
    for transformed in (torch.exp(s / 1e3), 3 * s + 7, torch.atan(s / 1e3)):
        # Strictly increasing maps preserve ranks (and ties) exactly in float64 here.
        if torch.equal(torch.argsort(transformed, stable=True), torch.argsort(s, stable=True)):
            assert torch.equal(
                rule(s, keep, key=k).indices, rule(transformed, keep, key=k).indices
            )


@common
@given(st.integers(1, 10_000), st.integers(1, 100))
def test_kept_count_exact_decimal(n, percent):
    keep = percent / 100
    assert sbfunc.kept_count(n, keep) == max(1, (n * percent) // 100)


@common
@given(st.integers(1, 10_000), st.integers(1, 1000))
def test_kept_count_exact_three_digit_decimal(n, permille):
    keep = permille / 1000
    assert sbfunc.kept_count(n, keep) == max(1, (n * permille) // 1000)


def test_kept_count_examples():
    assert sbfunc.kept_count(100, 0.29) == 29  # int(0.29 * 100) == 28
    assert sbfunc.kept_count(1, 0.5) == 1  # Composer returns an empty batch
    assert sbfunc.kept_count(10, 1.0) == 10


@pytest.mark.parametrize("keep", [0, -0.1, 1.01, float("nan"), float("inf")])
def test_keep_range(keep):
    with pytest.raises(ValueError, match=r"keep must be in \(0, 1\]"):
        sbfunc.rank_power(torch.zeros(4), keep, key=sbrandom.key(0))


@pytest.mark.parametrize("keep", ["0.5", None, True])
def test_keep_type(keep):
    with pytest.raises(TypeError, match="keep"):
        sbfunc.top_k(torch.zeros(4), keep)


@pytest.mark.parametrize(("n", "error"), [(-1, ValueError), (2.0, TypeError), (True, TypeError)])
def test_kept_count_n(n, error):
    with pytest.raises(error, match="n \\(the batch size\\)"):
        sbfunc.kept_count(n, 0.5)


def test_kept_count_of_an_empty_batch_is_zero():
    assert sbfunc.kept_count(0, 0.5) == 0 and sbfunc.kept_count(0, 1.0) == 0


@pytest.mark.parametrize("scores", [torch.zeros(2, 2), torch.tensor(1.0)])
def test_scores_shape(scores):
    with pytest.raises(ValueError, match="scores must be a 1-D tensor"):
        sbfunc.top_k(scores, 0.5)
    with pytest.raises(TypeError, match="scores must be a 1-D tensor"):
        sbfunc.top_k([1.0, 2.0], 0.5)


def test_top_k_picks_highest_and_keep_one_is_everything():
    s = torch.tensor([0.1, 2.0, 0.3, 5.0, -1.0])
    assert sbfunc.top_k(s, 0.4).indices.tolist() == [1, 3]
    assert sbfunc.rank_power(s, 1.0, key=sbrandom.key(0)).indices.tolist() == [0, 1, 2, 3, 4]


def test_ties_broken_at_random_not_by_position():
    s = torch.zeros(10)
    picks = torch.zeros(10)
    for seed in range(400):
        picks[sbfunc.top_k(s, 0.1, key=sbrandom.key(seed)).indices] += 1
    # Each of the 10 tied rows is picked about 40 times; by position it would be always row 0.
    assert picks.min() > 15 and picks.max() < 70
    ranks = torch.stack([sbfunc.ranks(s, key=sbrandom.key(i)) for i in range(200)]).float()
    assert ranks.mean(0).sub(4.5).abs().max() < 1.0


def test_ranks_without_key_is_stable():
    assert sbfunc.ranks(torch.tensor([1.0, 1.0, 0.0])).tolist() == [1, 2, 0]


def _reference_inclusion(n, keep, trials, rng):
    """Composer's sampler: numpy choice without replacement, p from rank weights."""
    k = max(1, math.floor(keep * n + 1e-9))
    w = ((np.arange(n) + 0.5) / n) ** (1 / keep - 1)
    counts = np.zeros(n)
    for _ in range(trials):
        counts[rng.choice(n, k, replace=False, p=w / w.sum())] += 1
    return counts / trials


@pytest.mark.parametrize(("n", "keep"), [(16, 0.5), (20, 0.25), (12, 0.75)])
def test_gumbel_top_k_matches_sequential_sampler(n, keep):
    trials = 6000
    reference = _reference_inclusion(n, keep, trials, np.random.default_rng(0))
    scores = torch.arange(n, dtype=torch.float32)  # rank r == row r
    keys = sbrandom.split(sbrandom.key(0), trials)
    counts = torch.zeros(n, dtype=torch.float64)
    for k in keys:
        counts[sbfunc.rank_power(scores, keep, key=k).indices] += 1
    ours = (counts / trials).numpy()
    # Two independent estimates of probabilities p: the std of their difference is at most
    # sqrt(2 * 0.25 / trials) ~= 0.0091; allow 5 standard deviations.
    assert np.abs(ours - reference).max() < 5 * math.sqrt(0.5 / trials)
    if (n, keep) == (16, 0.5):  # the inclusion probabilities quoted in REFERENCES.md
        assert abs(ours[0] - 0.05) < 0.02 and abs(ours[-1] - 0.79) < 0.03


def test_random_subset_is_uniform():
    counts = torch.zeros(8)
    for k in sbrandom.split(sbrandom.key(1), 4000):
        counts[sbfunc.random_subset(torch.arange(8.0), 0.25, key=k).indices] += 1
    freq = counts / 4000
    assert (freq - 0.25).abs().max() < 5 * math.sqrt(0.25 * 0.75 / 4000)


def test_no_global_rng_use():
    torch.manual_seed(0)
    expected = torch.rand(2)
    torch.manual_seed(0)
    sbfunc.rank_power(torch.arange(32.0), 0.5, key=sbrandom.key(3))
    assert torch.equal(torch.rand(2), expected)


noise_st = st.integers(1, 40).flatmap(
    lambda n: st.tuples(
        st.lists(st.sampled_from([0.0, 1.0, 2.0, -3.5, 7.25]), min_size=n, max_size=n),
        st.lists(st.integers(0, 2**32 - 1), min_size=n, max_size=n),
        st.lists(st.floats(0.0, 1.0, exclude_max=True), min_size=n, max_size=n),
    )
)


@common
@given(noise_st, keep_st)
def test_rank_power_indices_is_a_function_of_its_noise(noise, keep):
    scores, tie, u = torch.tensor(noise[0]), torch.tensor(noise[1]), torch.tensor(noise[2])
    idx = sbfunc.select.rank_power_indices(scores, keep, tie, u)
    assert torch.equal(idx, sbfunc.select.rank_power_indices(scores, keep, tie, u))
    assert idx.numel() == sbfunc.kept_count(len(scores), keep)
    assert idx.dtype == torch.int64 and bool((idx[1:] > idx[:-1]).all())
    # with equal uniforms the Gumbel noise is flat: the kept rows are the top-ranked ones
    flat = sbfunc.select.rank_power_indices(scores, keep, tie, torch.full_like(u, 0.5))
    order = sbfunc.select.ascending_order(scores, tie)
    assert torch.equal(flat, torch.sort(order[len(scores) - idx.numel() :]).values)


def test_rank_power_indices_breaks_ties_by_the_given_noise():
    scores, u = torch.zeros(4), torch.full((4,), 0.5)
    for winner in range(4):
        tie = torch.zeros(4, dtype=torch.int64)
        tie[winner] = 7  # the largest noise ranks highest among equal scores
        assert sbfunc.select.rank_power_indices(scores, 0.25, tie, u).tolist() == [winner]
