import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sbfunc import random as sbrandom
from sbfunc.policies import jiang_cdf, stale_sb
from sbfunc.policies._jiang import needs_scoring
from tests.policies.helpers import assert_mean_close, draws, kept_counts, weighted_means


@settings(max_examples=12, deadline=None, derandomize=True, database=None)
@given(
    n=st.integers(2, 40),
    beta=st.sampled_from([0.5, 1.0, 2.0, 3.0]),
    sampling_min=st.sampled_from([0.0, 0.1, 0.5]),
    seed=st.integers(0, 999),
)
def test_expected_kept_count_from_a_fresh_history(n, beta, sampling_min, seed):
    # A fresh history holds just the batch: CDF of rank r (0 = lowest) is (r + 1) / n.
    scores = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).float()
    p = ((scores + 1) / n).pow(beta).clamp_min(sampling_min)
    counts = kept_counts(draws(jiang_cdf(beta, 64, sampling_min), scores, n=400, seed=seed))
    assert_mean_close(counts, float(p.sum()))  # the top row has p = 1: never the fallback


def test_stationary_kept_fraction_is_one_over_beta_plus_one():
    # On i.i.d. losses the CDF value is uniform, so E[CDF^beta] = 1 / (beta + 1).
    for beta in (1.0, 2.0, 3.0):
        policy, state, kept = jiang_cdf(beta, history=1024), None, []
        state = policy.init()
        for t in range(200):
            key = sbrandom.fold_in(sbrandom.key(1), t)
            scores = sbrandom.uniform(sbrandom.fold_in(key, 1), (64,)).exp()
            sel, state = policy.select(scores, state, key=key)
            if t >= 20:  # after the history has filled
                kept.append(sel.indices.shape[0] / 64)
        fraction = sum(kept) / len(kept)
        assert abs(fraction - 1 / (beta + 1)) < 0.02, (beta, fraction)  # ~6 standard errors


def test_batch_enters_history_first_so_its_maximum_is_always_kept():
    policy = jiang_cdf(3.0, history=4)
    state = policy.init()
    for t in range(30):
        scores = sbrandom.uniform(sbrandom.key(t), (10,))
        sel, state = policy.select(scores, state, key=sbrandom.key(100 + t))
        assert int(scores.argmax()) in sel.indices.tolist()
        assert int(state.pushed) == 10 * (t + 1)


def test_reweighted_jiang_mean_is_unbiased():
    losses = torch.tensor([0.1, 0.5, 1.0, 2.0, 4.0, 8.0, 0.2, 0.3])
    policy = jiang_cdf(1.0, history=32, sampling_min=0.1, reweight=True)
    means = weighted_means(draws(policy, losses, n=4000), losses)
    # The fallback (nothing drawn) never happens: the batch maximum has keep probability 1.
    assert_mean_close(means, float(losses.double().mean()))


def test_needs_scoring_follows_the_age_of_the_cached_loss():
    policy = stale_sb(1.0, num_ids=6, max_age=2)
    state = policy.init()
    ids = torch.tensor([0, 1, 2])
    assert needs_scoring(state, ids, 0).tolist() == [True, True, True]
    _, state = policy.select(torch.rand(3), state, key=sbrandom.key(0), ids=ids, epoch=3)
    both = torch.tensor([0, 1, 2, 3])
    assert needs_scoring(state, both, 3).tolist() == [False, False, False, True]
    assert needs_scoring(state, both, 4).tolist() == [False, False, False, True]
    assert needs_scoring(state, both, 5).tolist() == [True, True, True, True]


def test_rows_not_scored_use_their_cached_loss_and_ignore_scores():
    policy = stale_sb(2.0, num_ids=8, max_age=3, history=16)
    ids = torch.tensor([5, 2, 7, 0])
    fresh = torch.tensor([1.0, 4.0, 2.0, 3.0])
    _, state = policy.select(fresh, policy.init(), key=sbrandom.key(0), ids=ids, epoch=0)
    assert state.table.loss[ids].tolist() == fresh.tolist()
    assert state.table.epoch[ids].tolist() == [0, 0, 0, 0]
    key, none = sbrandom.key(1), torch.zeros(4, dtype=torch.bool)
    placeholder, s1 = policy.select(torch.zeros(4), state, key=key, ids=ids, epoch=1, scored=none)
    with_cache, s2 = policy.select(fresh, state, key=key, ids=ids, epoch=1)
    assert torch.equal(placeholder.indices, with_cache.indices)
    assert torch.equal(s1.history.values, s2.history.values)
    assert s1.table.epoch[ids].tolist() == [0, 0, 0, 0]  # cached entries keep their epoch


def test_record_caches_losses_so_they_need_no_scoring():
    policy = stale_sb(1.0, num_ids=4, max_age=2)
    state = policy.record(policy.init(), torch.tensor([1, 2]), torch.tensor([0.5, 0.7]), 3)
    assert needs_scoring(state, torch.tensor([0, 1, 2, 3]), 4).tolist() == [
        True,
        False,
        False,
        True,
    ]
    assert state.table.loss[[1, 2]].tolist() == pytest.approx([0.5, 0.7])
    nan = policy.record(state, torch.tensor([1]), torch.tensor([float("nan")]), 4)
    assert nan.table.loss[1] == state.table.loss[1]  # a non-finite loss is never recorded


@settings(max_examples=10, deadline=None, derandomize=True, database=None)
@given(seed=st.integers(0, 999), beta=st.sampled_from([1.0, 2.0]))
def test_stale_sb_with_max_age_one_is_plain_jiang(seed, beta):
    stale, plain = stale_sb(beta, num_ids=32, max_age=1, history=24), jiang_cdf(beta, 24)
    s_state, p_state = stale.init(), plain.init()
    for t in range(6):
        key = sbrandom.fold_in(sbrandom.key(seed), t)
        ids = torch.randperm(32, generator=torch.Generator().manual_seed(seed + t))[:8]
        scores = sbrandom.uniform(sbrandom.fold_in(key, 7), (8,))
        a, s_state = stale.select(scores, s_state, key=key, ids=ids, epoch=t)
        b, p_state = plain.select(scores, p_state, key=key)
        assert torch.equal(a.indices, b.indices)
