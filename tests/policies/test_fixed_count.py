import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc import random as sbrandom
from sbfunc.policies import random_policy, rank_power_policy, rho_loss, top_k_policy
from tests.policies.helpers import assert_mean_close, draws, weighted_means

keeps = st.sampled_from([0.1, 0.25, 0.5, 0.9, 1.0])


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(n=st.integers(1, 50), keep=keeps, seed=st.integers(0, 999))
def test_fixed_count_policies_keep_exactly_kept_count(n, keep, seed):
    scores = sbrandom.uniform(sbrandom.key(seed), (n,))
    for make in (rank_power_policy, top_k_policy, random_policy):
        policy = make(keep)
        sel, state = policy.select(scores, policy.init(), key=sbrandom.key(seed))
        assert sel.indices.shape[0] == sbfunc.kept_count(n, keep)
        assert sel.weights is None and state == policy.init()


@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(n=st.integers(1, 30), keep=keeps, seed=st.integers(0, 999))
def test_policies_agree_with_the_select_functions(n, keep, seed):
    scores, key = sbrandom.uniform(sbrandom.key(seed), (n,)), sbrandom.key(seed + 1)
    for make, fn in (
        (rank_power_policy, sbfunc.rank_power),
        (top_k_policy, sbfunc.top_k),
        (random_policy, sbfunc.random_subset),
    ):
        policy = make(keep)
        got = policy.select(scores, policy.init(), key=key)[0].indices
        assert torch.equal(got, fn(scores, keep, key=key).indices)


def test_random_policy_plain_mean_is_unbiased():
    # every row has inclusion probability k/N, so E[mean over kept rows] = full mean.
    losses = torch.linspace(0, 3, 20) ** 2
    means = weighted_means(draws(random_policy(0.25), losses, n=3000), losses)
    assert_mean_close(means, float(losses.double().mean()))


def test_rho_loss_is_top_k_of_reducible_loss():
    irreducible = torch.tensor([0.0, 5.0, 0.5, 9.0, 0.0, 0.1])
    ids = torch.tensor([3, 1, 0, 5])
    scores = torch.tensor([9.5, 6.0, 0.2, 0.3])  # reducible: 0.5, 1.0, 0.2, 0.2
    policy = rho_loss(0.5, irreducible)
    sel, _ = policy.select(scores, policy.init(), key=sbrandom.key(0), ids=ids)
    assert sel.indices.tolist() == [0, 1]
    # plain loss-based top-k chases the rows with high irreducible loss (e.g. mislabelled)
    assert sbfunc.top_k(scores, 0.5).indices.tolist() == [0, 1]
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
