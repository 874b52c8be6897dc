"""The fixed-count policies: rank-power (Composer's law), top-k, random subset, RHO-LOSS."""

import math
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sbfunc import random as sbrandom
from sbfunc.policies import random_subset, rank_power, rho_loss, top_k
from sbfunc.select import Selection, kept_count, ranks
from sbfunc.types import EmptyState
from tests.policies.helpers import assert_mean_close, draws, weighted_means

MAKERS = [rank_power, random_subset, top_k]
scores_st = st.lists(
    st.floats(-1e3, 1e3, allow_nan=False, allow_subnormal=False), min_size=1, max_size=64
)
keep_st = st.floats(0.01, 1.0)
seed_st = st.integers(0, 2**32)
keeps = st.sampled_from([0.1, 0.25, 0.5, 0.9, 1.0])
common = settings(max_examples=60, deadline=None, derandomize=True, database=None)


def pick(make, scores: torch.Tensor, keep: float, key) -> Selection:
    """One selection of the stateless policy ``make(keep)``."""
    sel, state = make(keep).select(scores, EmptyState(), key=key)
    assert state == EmptyState()
    return sel


def test_draws_are_those_of_the_select_functions_they_replace():
    # Pinned with the select functions of sbfunc 0.2 (rank_power(scores, keep, key=...),
    # top_k(...), random_subset(...)): the policies draw the same rows for the same key.
    s = sbrandom.normal(sbrandom.key(7), (12,))
    s[:3] = s[3]  # ties
    expected = {
        rank_power: [[0, 4, 5, 6, 10, 11], [1, 3, 4, 5, 6, 11], [0, 1, 6, 7, 8, 11]],
        top_k: [[2, 3, 4, 5, 6, 11], [0, 3, 4, 5, 6, 11], [0, 2, 4, 5, 6, 11]],
        random_subset: [[0, 1, 4, 7, 8, 10], [1, 4, 5, 6, 7, 9], [1, 3, 6, 8, 9, 10]],
    }
    for make, rows in expected.items():
        assert [pick(make, s, 0.5, sbrandom.key(i)).indices.tolist() for i in range(3)] == rows


@common
@given(scores_st, keep_st, seed_st, st.sampled_from(MAKERS))
def test_indices_unique_sorted_in_range_with_kept_count(scores, keep, seed, make):
    sel = pick(make, torch.tensor(scores), keep, sbrandom.key(seed))
    idx = sel.indices
    assert idx.dtype == torch.int64 and idx.dim() == 1
    assert idx.numel() == max(1, math.floor(keep * len(scores) + 1e-9))
    assert idx.numel() == kept_count(len(scores), keep)
    assert torch.all(idx[1:] > idx[:-1])
    assert idx.min() >= 0 and idx.max() < len(scores)
    assert sel.weights is None


@common
@given(scores_st, keep_st, seed_st, st.sampled_from(MAKERS))
def test_same_key_same_selection(scores, keep, seed, make):
    s = torch.tensor(scores)
    a = pick(make, s, keep, sbrandom.key(seed)).indices
    assert torch.equal(a, pick(make, s, keep, sbrandom.key(seed)).indices)


@common
@given(scores_st, keep_st, seed_st, st.sampled_from([rank_power, top_k]))
def test_rank_only_rules_invariant_under_increasing_transforms(scores, keep, seed, make):
    s = torch.tensor(scores, dtype=torch.float64)
    k = sbrandom.key(seed)
    for transformed in (torch.exp(s / 1e3), 3 * s + 7, torch.atan(s / 1e3)):
        # The maps are increasing in exact arithmetic, but rounding can merge two scores into
        # one value (exp(-1.6e-126 / 1e3) == exp(0) == 1.0): a new tie, which the rules break
        # at random. The claim is for maps that keep the order *and* the ties, so check both.
        if same_order_and_ties(s, transformed):
            assert torch.equal(
                pick(make, s, keep, k).indices, pick(make, transformed, keep, k).indices
            )


def same_order_and_ties(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``b`` ranks its entries exactly as ``a`` does, ties included (dense ranks)."""
    return torch.equal(
        torch.unique(a, return_inverse=True)[1], torch.unique(b, return_inverse=True)[1]
    )


def test_same_order_and_ties_sees_a_tie_made_by_rounding():
    s = torch.tensor([-1.583311112282909e-126, 0.0], dtype=torch.float64)
    assert torch.equal(torch.argsort(torch.exp(s / 1e3), stable=True), torch.argsort(s))
    assert not same_order_and_ties(s, torch.exp(s / 1e3))  # the old check's blind spot
    t = torch.tensor([2.0, -1.0, 2.0, 0.5], dtype=torch.float64)
    assert same_order_and_ties(t, 3 * t + 7)  # the tie between rows 0 and 2 kept
    assert not same_order_and_ties(t, -t)


@pytest.mark.parametrize("make", MAKERS)
@pytest.mark.parametrize("keep", [0, -0.1, 1.01, float("nan"), float("inf")])
def test_keep_range(make, keep):
    with pytest.raises(ValueError, match=r"keep must be in \(0, 1\]"):
        make(keep)


@pytest.mark.parametrize("keep", ["0.5", None, True])
def test_keep_type(keep):
    with pytest.raises(TypeError, match="keep"):
        top_k(keep)


@pytest.mark.parametrize("scores", [torch.zeros(2, 2), torch.tensor(1.0)])
@pytest.mark.parametrize("make", MAKERS)
def test_scores_shape(scores, make):
    with pytest.raises(ValueError, match="scores must be a 1-D tensor"):
        pick(make, scores, 0.5, sbrandom.key(0))
    with pytest.raises(TypeError, match="scores must be a 1-D tensor"):
        pick(make, [1.0, 2.0], 0.5, sbrandom.key(0))
    with pytest.raises(TypeError, match="scores must be a 1-D tensor of real numbers"):
        pick(make, torch.zeros(2, dtype=torch.complex64), 0.5, sbrandom.key(0))


@pytest.mark.parametrize("make", MAKERS)
def test_integer_scores_like_composers_fake_loss_are_ranked_as_floats(make):
    # Composer's Selective Backprop test scores with an int64 fake loss; 0.2 accepted it.
    losses = torch.tensor([3, 0, 7, 7, 1, 5, 2, 6])
    for seed in range(5):
        key = sbrandom.key(seed)
        as_float = pick(make, losses.to(torch.get_default_dtype()), 0.5, key).indices
        assert torch.equal(pick(make, losses, 0.5, key).indices, as_float)


def test_top_k_picks_highest_and_keep_one_is_everything():
    s = torch.tensor([0.1, 2.0, 0.3, 5.0, -1.0])
    assert pick(top_k, s, 0.4, sbrandom.key(0)).indices.tolist() == [1, 3]
    assert pick(rank_power, s, 1.0, sbrandom.key(0)).indices.tolist() == [0, 1, 2, 3, 4]


def test_ties_broken_at_random_not_by_position():
    s = torch.zeros(10)
    picks = torch.zeros(10)
    for seed in range(400):
        picks[pick(top_k, s, 0.1, sbrandom.key(seed)).indices] += 1
    # Each of the 10 tied rows is picked about 40 times; by position it would be always row 0.
    assert picks.min() > 15 and picks.max() < 70
    r = torch.stack([ranks(s, key=sbrandom.key(i)) for i in range(200)]).float()
    assert r.mean(0).sub(4.5).abs().max() < 1.0


def _reference_inclusion(n, keep, trials, rng):
    """Composer's sampler: numpy choice without replacement, p from rank weights."""
    k = max(1, math.floor(keep * n + 1e-9))
    w = ((np.arange(n) + 0.5) / n) ** (1 / keep - 1)
    counts = np.zeros(n)
    for _ in range(trials):
        counts[rng.choice(n, k, replace=False, p=w / w.sum())] += 1
    return counts / trials


@pytest.mark.parametrize(("n", "keep"), [(16, 0.5), (20, 0.25), (12, 0.75)])
def test_rank_power_matches_composers_sequential_sampler(n, keep):
    trials = 6000
    reference = _reference_inclusion(n, keep, trials, np.random.default_rng(0))
    scores = torch.arange(n, dtype=torch.float32)  # rank r == row r
    counts = torch.zeros(n, dtype=torch.float64)
    for sel in draws(rank_power(keep), scores, n=trials):
        counts[sel.indices] += 1
    ours = (counts / trials).numpy()
    # Two independent estimates of probabilities p: the std of their difference is at most
    # sqrt(2 * 0.25 / trials) ~= 0.0091; allow 5 standard deviations.
    assert np.abs(ours - reference).max() < 5 * math.sqrt(0.5 / trials)
    if (n, keep) == (16, 0.5):  # the inclusion probabilities quoted in REFERENCES.md
        assert abs(ours[0] - 0.05) < 0.02 and abs(ours[-1] - 0.79) < 0.03


def test_random_subset_is_uniform():
    counts = torch.zeros(8)
    for sel in draws(random_subset(0.25), torch.arange(8.0), n=4000, seed=1):
        counts[sel.indices] += 1
    freq = counts / 4000
    assert (freq - 0.25).abs().max() < 5 * math.sqrt(0.25 * 0.75 / 4000)


def test_random_subset_plain_mean_is_unbiased():
    # every row has inclusion probability k/N, so E[mean over kept rows] = full mean.
    losses = torch.linspace(0, 3, 20) ** 2
    means = weighted_means(draws(random_subset(0.25), losses, n=3000), losses)
    assert_mean_close(means, float(losses.double().mean()))


def test_no_global_rng_use():
    torch.manual_seed(0)
    expected = torch.rand(2)
    torch.manual_seed(0)
    pick(rank_power, torch.arange(32.0), 0.5, sbrandom.key(3))
    assert torch.equal(torch.rand(2), expected)


def test_rho_loss_is_top_k_of_reducible_loss():
    irreducible = torch.tensor([0.0, 5.0, 0.5, 9.0, 0.0, 0.1])
    ids = torch.tensor([3, 1, 0, 5])
    scores = torch.tensor([9.5, 6.0, 0.2, 0.3])  # reducible: 0.5, 1.0, 0.2, 0.2
    policy = rho_loss(0.5, irreducible)
    sel, _ = policy.select(scores, policy.init(), key=sbrandom.key(0), ids=ids)
    assert sel.indices.tolist() == [0, 1]
    # plain loss-based top-k chases the rows with high irreducible loss (e.g. mislabelled)
    assert pick(top_k, scores, 0.5, sbrandom.key(0)).indices.tolist() == [0, 1]
    sel, _ = policy.select(
        torch.tensor([9.5, 6.0, 2.0, 0.3]), policy.init(), key=sbrandom.key(0), ids=ids
    )
    assert sel.indices.tolist() == [1, 2]


def test_rho_loss_does_not_alias_the_irreducible_tensor():
    irreducible = torch.zeros(3)
    policy = rho_loss(0.34, irreducible)
    irreducible[0] = 100.0  # a later edit by the caller does not leak into the policy
    sel, _ = policy.select(
        torch.tensor([1.0, 2.0, 3.0]), policy.init(), key=sbrandom.key(0), ids=torch.arange(3)
    )
    assert sel.indices.tolist() == [2]


def test_rho_loss_rejects_non_float_tables():
    with pytest.raises(TypeError, match="irreducible"):
        rho_loss(0.5, [0.0, 1.0])  # type: ignore[arg-type]


def test_rho_loss_names_a_table_shorter_than_the_ids():
    policy = rho_loss(0.5, torch.tensor([0.0, 1.0, 2.0, 3.0]))

    def select(ids):
        return policy.select(torch.ones(3), policy.init(), key=sbrandom.key(0), ids=ids)[0]

    assert select(torch.tensor([3, 1, 0])).indices.tolist() == [2]  # the last id is served
    message = (
        "rho_loss: irreducible has 4 entries (sample ids 0 to 3) but the largest id is 9: give "
        "irreducible one entry per dataset index (length > 9), or pass ids that are dataset "
        "indices in [0, 4)"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        select(torch.tensor([0, 9, 2]))
    with pytest.raises(ValueError, match=re.escape("but an id is -1: pass ids that are dataset")):
        select(torch.tensor([0, -1, 2]))
    with pytest.raises(ValueError, match="irreducible must have one entry per sample id, got an"):
        rho_loss(0.5, torch.zeros(0))


def test_rho_loss_without_ids_names_the_selective_backprop_field_and_the_select_argument():
    policy = rho_loss(0.5, torch.zeros(3))
    with pytest.raises(ValueError, match="needs sample ids") as error:
        policy.select(torch.ones(3), policy.init(), key=sbrandom.key(0))
    assert 'SelectiveBackprop(ids="<field holding each row\'s dataset index>")' in str(error.value)
    assert "select(..., ids=<int64 Tensor[N]>)" in str(error.value)
