import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc import random as sbrandom
from sbfunc.policies import loshchilov
from tests.policies.helpers import assert_mean_close, draws


def chosen(selections, row):
    return torch.tensor(
        [float(row in s.indices.tolist()) for s in selections], dtype=torch.float64
    )


@pytest.mark.parametrize("s_e", [1.0, 10.0, 100.0])
def test_top_sample_is_s_e_times_likelier_than_the_bottom(s_e):
    policy = loshchilov(s_e, 0.5, num_ids=2)
    sels = draws(policy, torch.tensor([0.3, 2.0]), n=2000, ids=torch.tensor([0, 1]))
    assert_mean_close(chosen(sels, 1), s_e / (1 + s_e))


def test_ranks_are_over_every_seen_id_not_just_the_batch():
    policy = loshchilov(100.0, 0.5, num_ids=3)
    _, state = policy.select(
        torch.tensor([10.0]), policy.init(), key=sbrandom.key(0), ids=torch.tensor([0])
    )
    # id 0 (loss 10) is rank 0; ids 2 (loss 2) and 1 (loss 1) are ranks 1 and 2 of M = 3:
    # weights 100**-0.5 and 100**-1, so id 2 wins with 0.1 / 0.11 (0.99 if ranked in-batch).
    sels = draws(policy, torch.tensor([1.0, 2.0]), state, n=2000, ids=torch.tensor([1, 2]))
    assert_mean_close(chosen(sels, 1), 0.1 / 0.11)


@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(n=st.integers(1, 30), keep=st.sampled_from([0.1, 0.5, 1.0]), seed=st.integers(0, 99))
def test_keeps_kept_count_and_records_every_loss(n, keep, seed):
    policy = loshchilov(50.0, keep, num_ids=40)
    ids = torch.randperm(40, generator=torch.Generator().manual_seed(seed))[:n]
    scores = sbrandom.uniform(sbrandom.key(seed), (n,))
    sel, table = policy.select(scores, policy.init(), key=sbrandom.key(seed), ids=ids, epoch=3)
    assert sel.indices.shape[0] == sbfunc.select.kept_count(n, keep) and sel.weights is None
    assert torch.equal(table.loss[ids], scores) and bool((table.epoch[ids] == 3).all())
    assert int((table.epoch >= 0).sum()) == n
