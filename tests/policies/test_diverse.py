"""The DivBS policy: DivBS's greedy on the signals' gradient Gram matrix,
one row of each cluster, non-finite scores last."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sbfunc import random as sbrandom
from sbfunc.policies import divbs, divbs_indices, gradient_gram, last_layer_errors
from sbfunc.score import Signals
from sbfunc.select import kept_count

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True, database=None)


def random_signals(n: int, seed: int, classes: int = 3, width: int = 4) -> Signals:
    g = torch.Generator().manual_seed(seed)
    return Signals(
        torch.randn(n, classes, generator=g),
        torch.randn(n, width, generator=g),
        torch.randint(0, classes, (n,), generator=g),
    )


def select(keep: float, scores: torch.Tensor, signals: Signals, seed: int) -> torch.Tensor:
    policy = divbs(keep)
    sel, state = policy.select(scores, policy.init(), key=sbrandom.key(seed), signals=signals)
    assert sel.weights is None and state == policy.init()
    return sel.indices


@SETTINGS
@given(n=st.integers(1, 16), keep=st.floats(0.05, 1.0), seed=st.integers(0, 2**16))
def test_the_policy_is_divbs_indices_on_the_gradient_gram(n, keep, seed):
    s = random_signals(n, seed)
    gram = gradient_gram(last_layer_errors(s.logits, s.targets), s.features)
    greedy_key = sbrandom.split(sbrandom.key(seed))[0]
    expected = divbs_indices(gram, kept_count(n, keep), key=greedy_key)
    assert torch.equal(select(keep, torch.rand(n), s, seed), expected)


@SETTINGS
@given(
    sizes=st.lists(st.integers(1, 5), min_size=1, max_size=5),
    scales=st.lists(st.floats(0.1, 10.0), min_size=25, max_size=25),
    seed=st.integers(0, 2**16),
)
def test_orthogonal_clusters_keep_one_row_of_each(sizes, scales, seed):
    # every row of cluster j: the same softmax error, features along axis j (any scale)
    cluster = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    n, m = cluster.shape[0], len(sizes)
    features = torch.eye(m)[cluster] * torch.tensor(scales[:n]).unsqueeze(1)
    signals = Signals(torch.zeros(n, 2), features, torch.zeros(n, dtype=torch.int64))
    kept = select(min(1.0, (m + 0.5) / n), torch.ones(n), signals, seed)
    assert sorted(cluster[kept].tolist()) == list(range(m))


@SETTINGS
@given(
    n=st.integers(1, 16),
    keep=st.floats(0.05, 1.0),
    bad=st.lists(st.sampled_from([float("nan"), float("inf"), -float("inf")]), max_size=16),
    seed=st.integers(0, 2**16),
)
def test_nonfinite_scores_are_kept_only_to_fill_k(n, keep, bad, seed):
    scores = torch.rand(n)
    rows = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[: len(bad)]
    scores[rows] = torch.tensor(bad[: rows.shape[0]])
    kept = select(keep, scores, random_signals(n, seed), seed)
    k, finite = kept_count(n, keep), torch.isfinite(scores)
    assert kept.shape == (k,) and bool((kept[1:] > kept[:-1]).all())
    assert int(finite[kept].sum()) == min(k, int(finite.sum()))


def test_duplicates_of_a_nonfinite_row_never_displace_finite_rows():
    # rows 0-2 finite and parallel: after one of them, the greedy picks at random among the
    # rest; the non-finite rows 3-5 (zero features) must not be among them
    features = torch.tensor([[1.0, 0.0]] * 3 + [[5.0, 5.0]] * 3)
    signals = Signals(torch.zeros(6, 2), features, torch.zeros(6, dtype=torch.int64))
    scores = torch.tensor([1.0, 1.0, 1.0, float("nan"), float("nan"), float("nan")])
    for seed in range(20):
        assert select(0.5, scores, signals, seed).tolist() == [0, 1, 2]


def test_missing_or_misshapen_signals_are_refused():
    policy = divbs(0.5)
    assert policy.needs == frozenset({"logits", "features", "targets"})
    with pytest.raises(ValueError, match="reads the signal"):
        policy.select(torch.ones(3), policy.init(), key=sbrandom.key(0))
    with pytest.raises(ValueError, match="one row per score"):
        policy.select(
            torch.ones(2), policy.init(), key=sbrandom.key(0), signals=random_signals(3, 0)
        )
