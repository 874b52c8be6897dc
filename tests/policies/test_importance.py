import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc import random as sbrandom
from sbfunc.policies import (
    grad_norm_importance,
    logit_grad_norm,
    tau_threshold,
    variance_reduction,
)
from tests.policies.helpers import assert_mean_close, draws, kept_counts, weighted_means


@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(n=st.integers(1, 8), c=st.integers(2, 6), seed=st.integers(0, 999))
def test_logit_grad_norm_is_the_norm_of_the_cross_entropy_logit_gradient(n, c, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, c, generator=g, requires_grad=True)
    targets = torch.randint(0, c, (n,), generator=g)
    loss = torch.nn.functional.cross_entropy(logits, targets, reduction="sum")
    (grad,) = torch.autograd.grad(loss, logits)
    expected = torch.linalg.vector_norm(grad, dim=1)
    assert torch.allclose(logit_grad_norm(logits, targets), expected, atol=1e-6)
    soft = torch.nn.functional.one_hot(targets, c).float()
    assert torch.allclose(logit_grad_norm(logits, soft), expected, atol=1e-6)


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(st.lists(st.floats(0, 10), min_size=2, max_size=20).filter(lambda s: sum(s) > 0))
def test_variance_reduction_matches_the_paper_formula(s):
    scores = torch.tensor(s, dtype=torch.float64)
    g = scores / scores.sum()
    u = torch.full_like(g, 1 / len(s))
    paper = 1 / (1 - (g - u).square().sum() / g.square().sum())
    assert torch.allclose(variance_reduction(scores), paper)
    assert 1 - 1e-9 <= float(variance_reduction(scores)) <= len(s) + 1e-9


def test_tau_threshold():
    assert tau_threshold(384, 128) == 2.0 and tau_threshold(5, 5) == 4 / 3


def test_importance_weights_make_the_weighted_mean_unbiased():
    scores = torch.tensor([0.05, 0.2, 0.9, 0.3, 1.2, 0.01, 0.5, 0.7])
    losses = torch.tensor([0.1, 0.8, 3.0, 1.0, 5.0, 0.05, 2.0, 2.5])
    sels = draws(grad_norm_importance(0.5, switch=False), scores, n=4000)
    assert_mean_close(weighted_means(sels, losses), float(losses.double().mean()))
    # duplicates are merged: at most k distinct rows, multiplicities sum to k
    k = sbfunc.select.kept_count(8, 0.5)
    assert float(kept_counts(sels).max()) <= k


def test_importance_sampling_prefers_high_scores():
    scores = torch.tensor([0.01, 0.01, 0.01, 10.0])
    sels = draws(grad_norm_importance(0.25, switch=False), scores, n=200)
    assert all(s.indices.tolist() == [3] for s in sels)


def test_switch_stays_uniform_until_tau_exceeds_the_threshold():
    policy = grad_norm_importance(0.25, smoothing=0.5)
    flat, peaked = torch.ones(16), torch.tensor([0.01] * 15 + [5.0])
    state = policy.init()
    sel, state = policy.select(peaked, state, key=sbrandom.key(0))
    # tau started at 0: uniform subset of k = 4 rows with unit weights
    assert sel.indices.shape[0] == 4 and torch.equal(sel.weights, torch.ones(4))
    assert float(state.tau) > tau_threshold(16, 4)  # 0.5 * 16 * sum(g^2) is large
    sel, state = policy.select(peaked, state, key=sbrandom.key(1))
    assert sel.indices.tolist() == [15]  # importance sampling is now on
    for t in range(10):
        _, state = policy.select(flat, state, key=sbrandom.key(2 + t))
    assert float(state.tau) < tau_threshold(16, 4)  # flat scores bring tau back to ~1


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(
    scores=st.lists(st.floats(0, 10, width=32), min_size=1, max_size=24),
    keep=st.sampled_from([0.1, 0.25, 0.5, 1.0]),
    seed=st.integers(0, 2**16),
    switch=st.booleans(),
)
def test_fixed_size_keeps_k_rows_and_the_same_estimate(scores, keep, seed, switch):
    s = torch.tensor(scores)
    losses = torch.linspace(0.5, 3.0, len(scores))
    key = sbrandom.key(seed)
    var, _ = grad_norm_importance(keep, switch=switch).select(
        s, grad_norm_importance(keep).init(), key=key
    )
    fix, _ = grad_norm_importance(keep, switch=switch, fixed_size=True).select(
        s, grad_norm_importance(keep).init(), key=key
    )
    k = sbfunc.select.kept_count(len(scores), keep)
    assert fix.indices.shape == (k,) and bool((fix.indices[1:] > fix.indices[:-1]).all())
    assert set(var.indices.tolist()) <= set(fix.indices.tolist())  # the drawn rows, then padding
    padding = ~torch.isin(fix.indices, var.indices)
    assert bool((fix.weights[padding] == 0).all())
    estimate_fix = (fix.weights * losses[fix.indices]).mean()
    estimate_var = (var.weights * losses[var.indices]).mean()
    assert torch.allclose(estimate_fix, estimate_var, rtol=1e-5)


def test_fixed_size_pads_with_finite_rows_first():
    s = torch.tensor([float("nan"), 0.0, 5.0, 0.0])
    policy = grad_norm_importance(0.5, switch=False, fixed_size=True)
    sel, _ = policy.select(s, policy.init(), key=sbrandom.key(0))
    assert sel.indices.tolist() == [1, 2]  # row 2 drawn (all the mass), row 1 the padding
    assert sel.weights.tolist()[0] == 0.0
