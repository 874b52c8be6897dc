"""One rule for non-finite scores on every selection path: NaN counts as +inf (NaN and +inf
rank highest, -inf lowest, ties broken by the key), and empty scores give empty selections."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc import random as sbrandom
from tests.policies.test_registry import NUM_IDS, POLICIES

NAN, INF = float("nan"), float("inf")
SETTINGS = settings(max_examples=40, derandomize=True, database=None, deadline=None)

values = st.one_of(st.floats(-5, 5, width=32), st.sampled_from([NAN, INF, -INF]))
score_lists = st.lists(values, min_size=1, max_size=24)
keeps = st.sampled_from([0.1, 0.3, 0.5, 0.9, 1.0])
seeds = st.integers(0, 2**16)

SAMPLERS = {
    "rank_power": lambda s, keep, key: sbfunc.rank_power(s, keep, key=key),
    "top_k": lambda s, keep, key: sbfunc.top_k(s, keep, key=key),
    "top_k_no_key": lambda s, keep, key: sbfunc.top_k(s, keep),
    "random_subset": lambda s, keep, key: sbfunc.random_subset(s, keep, key=key),
}


def _nan_to_inf(scores: torch.Tensor) -> torch.Tensor:
    return torch.where(scores.isnan(), INF, scores)


def _leaves(tree) -> list[torch.Tensor]:
    return [x for x in torch.utils._pytree.tree_leaves(tree) if isinstance(x, torch.Tensor)]


def _same_tree(a, b) -> bool:
    la, lb = _leaves(a), _leaves(b)
    return len(la) == len(lb) and all(
        x.shape == y.shape and bool(torch.isclose(x, y, rtol=0, atol=0, equal_nan=True).all())
        for x, y in zip(la, lb, strict=True)
    )


def _nonfinite(tree) -> int:
    return sum(int((~x.isfinite()).sum()) for x in _leaves(tree) if x.dtype.is_floating_point)


@pytest.mark.parametrize("name", sorted(SAMPLERS))
@SETTINGS
@given(scores=score_lists, keep=keeps, seed=seeds)
def test_nan_selects_like_plus_inf(name, scores, keep, seed):
    s = torch.tensor(scores)
    key = sbrandom.key(seed)
    a, b = SAMPLERS[name](s, keep, key), SAMPLERS[name](_nan_to_inf(s), keep, key)
    assert torch.equal(a.indices, b.indices)
    n, k = len(scores), sbfunc.kept_count(len(scores), keep)
    assert a.indices.shape == (k,) and torch.equal(a.indices, a.indices.unique())
    assert bool((a.indices >= 0).all() and (a.indices < n).all())


@SETTINGS
@given(scores=score_lists, seed=seeds)
def test_ranks_put_nan_and_inf_highest_and_minus_inf_lowest(scores, seed):
    s = torch.tensor(scores)
    r = sbfunc.ranks(s, key=sbrandom.key(seed))
    assert torch.equal(r.sort().values, torch.arange(len(scores)))
    assert torch.equal(r, sbfunc.ranks(_nan_to_inf(s), key=sbrandom.key(seed)))
    top = s.isnan() | s.isposinf()
    bottom = s.isneginf()
    finite = ~(top | bottom)
    if top.any() and (~top).any():
        assert r[top].min() > r[~top].max()
    if bottom.any() and (~bottom).any():
        assert r[bottom].max() < r[~bottom].min()
    fs, fr = s[finite], r[finite]  # finite scores keep their order
    assert not bool(((fs[:, None] < fs[None, :]) & (fr[:, None] > fr[None, :])).any())


@SETTINGS
@given(scores=score_lists, keep=keeps, seed=seeds)
def test_top_k_keeps_nan_and_inf_first(scores, keep, seed):
    s = torch.tensor(scores)
    kept = torch.zeros(len(scores), dtype=torch.bool)
    kept[sbfunc.top_k(s, keep, key=sbrandom.key(seed)).indices] = True
    top = s.isnan() | s.isposinf()
    k = int(kept.sum())
    assert int((kept & top).sum()) == min(k, int(top.sum()))  # never drops a NaN for a number
    if (s.isneginf() & kept).any():  # -inf only when nothing else is left
        assert bool(kept[~s.isneginf()].all())


@pytest.mark.parametrize("name", ["rank_power", "top_k", "random_subset"])
@pytest.mark.parametrize("n", [1, 7, 16])
def test_all_nan_scores_select_like_all_equal_scores(name, n):
    # All-NaN scores tie, so the key alone decides: a uniformly random selection, the same as
    # for all-equal finite scores.
    draws = set()
    for seed in range(8):
        key = sbrandom.key(seed)
        nan = SAMPLERS[name](torch.full((n,), NAN), 0.5, key).indices
        zero = SAMPLERS[name](torch.zeros(n), 0.5, key).indices
        assert torch.equal(nan, zero)
        draws.add(tuple(nan.tolist()))
    assert len(draws) > 1 or n == 1


@pytest.mark.parametrize("name", sorted(POLICIES))
@SETTINGS
@given(scores=score_lists, seed=seeds)
def test_every_policy_treats_nan_as_plus_inf_and_stays_finite(name, scores, seed):
    policy = POLICIES[name]()
    s = torch.tensor(scores)
    ids = torch.arange(len(scores)) % NUM_IDS
    kwargs = {"key": sbrandom.key(seed), "ids": ids, "epoch": 0, "elapsed": 0.3}
    state = policy.init()
    sel_nan, st_nan = policy.select(s, state, **kwargs)
    sel_inf, st_inf = policy.select(_nan_to_inf(s), state, **kwargs)
    assert torch.equal(sel_nan.indices, sel_inf.indices)
    assert _same_tree(st_nan, st_inf)
    n = len(scores)
    assert sel_nan.indices.numel() >= 1 and bool((sel_nan.indices < n).all())
    assert torch.equal(sel_nan.indices, sel_nan.indices.unique())
    if sel_nan.weights is not None:
        assert bool(torch.isfinite(sel_nan.weights).all() and (sel_nan.weights > 0).all())
    assert _nonfinite(st_nan) <= _nonfinite(state)  # no NaN or inf is ever recorded


@pytest.mark.parametrize("name", sorted(SAMPLERS))
@pytest.mark.parametrize("keep", [0.1, 1.0])
def test_empty_scores_give_an_empty_selection(name, keep):
    sel = SAMPLERS[name](torch.zeros(0), keep, sbrandom.key(0))
    assert sel.indices.shape == (0,) and sel.indices.dtype == torch.int64
    assert sel.weights is None


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_returns_an_empty_selection_and_its_state_for_empty_scores(name):
    policy = POLICIES[name]()
    _, state = policy.select(
        torch.rand(5), policy.init(), key=sbrandom.key(1), ids=torch.arange(5), epoch=0
    )
    sel, after = policy.select(
        torch.zeros(0),
        state,
        key=sbrandom.key(2),
        ids=torch.zeros(0, dtype=torch.int64),
        epoch=1,
        elapsed=0.5,
    )
    assert sel.indices.shape == (0,)
    assert _same_tree(after, state)


def test_empty_batch_size_take_and_kept_count():
    batch = (torch.zeros(0, 3), torch.zeros(0, dtype=torch.int64))
    assert sbfunc.batch_size(batch) == 0
    taken = sbfunc.take(batch, torch.zeros(0, dtype=torch.int64))
    assert taken[0].shape == (0, 3) and taken[1].shape == (0,)
    assert sbfunc.kept_count(0, 0.5) == 0
