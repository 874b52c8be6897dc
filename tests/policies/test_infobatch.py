import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sbfunc import random as sbrandom
from sbfunc.policies import infobatch
from tests.policies.helpers import assert_mean_close, draws, kept_counts, weighted_means

LAST = torch.tensor([0.1, 0.2, 0.3, 5.0, 6.0, 0.4, 7.0, 0.5])  # mean 2.4375: 5 learned rows


def recorded(policy, losses=LAST):
    ids = torch.arange(losses.shape[0])
    return policy.select(losses, policy.init(), key=sbrandom.key(0), ids=ids)


def test_first_visit_keeps_everything_with_unit_weights():
    sel, _ = recorded(infobatch(0.5, num_ids=8))
    assert sel.indices.tolist() == list(range(8)) and torch.equal(sel.weights, torch.ones(8))


@settings(max_examples=8, deadline=None, derandomize=True, database=None)
@given(r=st.sampled_from([0.0, 0.3, 0.5, 0.8]), seed=st.integers(0, 99))
def test_kept_count_and_unbiased_weighted_mean(r, seed):
    policy = infobatch(r, num_ids=8)
    _, state = recorded(policy)
    current = sbrandom.uniform(sbrandom.key(seed), (8,)) * 3  # this epoch's losses
    sels = draws(policy, current, state, n=800, seed=seed, ids=torch.arange(8), epoch=1)
    assert_mean_close(kept_counts(sels), 8 - r * 5)
    assert_mean_close(weighted_means(sels, current), float(current.double().mean()))
    for sel in sels:  # the high-loss rows are never pruned
        assert {3, 4, 6} <= set(sel.indices.tolist())


def test_kept_learned_rows_are_rescaled_by_one_over_one_minus_r():
    policy = infobatch(0.5, num_ids=8)
    _, state = recorded(policy)
    sel, _ = policy.select(LAST, state, key=sbrandom.key(3), ids=torch.arange(8), epoch=1)
    k = sel.indices.shape[0]
    learned = torch.tensor([i not in (3, 4, 6) for i in sel.indices.tolist()])
    expected = torch.where(learned, 2.0, 1.0) * k / 8
    assert torch.allclose(sel.weights, expected)


def test_pruning_stops_after_delta():
    policy = infobatch(0.9, delta=0.5, num_ids=8)
    _, state = recorded(policy)
    for elapsed in (0.5, 0.75, 1.0):
        sel, new = policy.select(
            LAST, state, key=sbrandom.key(1), ids=torch.arange(8), elapsed=elapsed, epoch=2
        )
        assert sel.indices.tolist() == list(range(8)) and torch.equal(sel.weights, torch.ones(8))
        assert bool((new.epoch == 2).all())  # losses are still recorded
        # a compiled step passes elapsed and epoch as 0-d tensors: same decision
        same, _ = policy.select(
            LAST,
            state,
            key=sbrandom.key(1),
            ids=torch.arange(8),
            elapsed=torch.tensor(elapsed),
            epoch=torch.tensor(2),
        )
        assert torch.equal(same.indices, sel.indices) and torch.equal(same.weights, sel.weights)
