import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sbfunc import random as sbrandom
from sbfunc.policies import rank_power_indices
from sbfunc.select import ascending_order, gumbel_top_k, kept_count

keep_st = st.floats(0.01, 1.0)
common = settings(max_examples=60, deadline=None, derandomize=True, database=None)


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
    idx = rank_power_indices(scores, keep, tie, u)
    assert torch.equal(idx, rank_power_indices(scores, keep, tie, u))
    assert idx.numel() == kept_count(len(scores), keep)
    assert idx.dtype == torch.int64 and bool((idx[1:] > idx[:-1]).all())
    # with equal uniforms the Gumbel noise is flat: the kept rows are the top-ranked ones
    flat = rank_power_indices(scores, keep, tie, torch.full_like(u, 0.5))
    order = ascending_order(scores, tie)
    assert torch.equal(flat, torch.sort(order[len(scores) - idx.numel() :]).values)


def test_rank_power_indices_breaks_ties_by_the_given_noise():
    scores, u = torch.zeros(4), torch.full((4,), 0.5)
    for winner in range(4):
        tie = torch.zeros(4, dtype=torch.int64)
        tie[winner] = 7  # the largest noise ranks highest among equal scores
        assert rank_power_indices(scores, 0.25, tie, u).tolist() == [winner]


@common
@given(st.integers(1, 30), st.integers(0, 30), st.integers(0, 2**16))
def test_gumbel_top_k_draws_non_finite_weights_last_and_at_random(n, bad, seed):
    bad = min(bad, n)
    log_w = torch.zeros(n)
    log_w[:bad] = -torch.inf
    log_w[: bad // 2] = torch.nan
    for k in {1, n // 2 or 1, n}:
        idx = gumbel_top_k(log_w, k, sbrandom.gumbel(sbrandom.key(seed), (n,)))
        assert idx.shape == (k,) and bool((idx[1:] > idx[:-1]).all())
        assert int((idx >= bad).sum()) == min(k, n - bad)  # every finite weight first


def test_gumbel_top_k_fills_with_non_finite_rows_uniformly():
    log_w = torch.tensor([0.0, -torch.inf, -torch.inf, -torch.inf])
    picks = torch.zeros(4)
    for k in sbrandom.split(sbrandom.key(0), 600):
        picks[gumbel_top_k(log_w, 2, sbrandom.gumbel(k, (4,)))] += 1
    assert picks[0] == 600 and picks[1:].min() > 150  # 200 each in expectation
