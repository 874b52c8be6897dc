import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc import random as sbrandom
from sbfunc.distributed import local_selection
from sbfunc.policies import infobatch, jiang_cdf, stale_sb
from sbfunc.selective_backprop import apply_policy
from sbfunc.selective_backprop._apply import score_needed, unscorable_dropped


def test_apply_policy_reads_ids_from_the_batch_and_prunes_every_leaf():
    policy = infobatch(0.5, num_ids=10)
    batch = (torch.arange(8.0)[:, None], torch.arange(8) % 3, torch.arange(2, 10))
    first = apply_policy(policy, policy.init(), batch, torch.rand(8), key=sbrandom.key(0), ids=2)
    assert torch.equal(first.batch[2], batch[2]) and torch.equal(first.weights, torch.ones(8))
    out = apply_policy(
        policy, first.state, batch, torch.rand(8), key=sbrandom.key(1), ids=2, epoch=1
    )
    assert torch.equal(out.batch[0][:, 0].long(), out.indices)
    assert torch.equal(out.batch[2], batch[2][out.indices]) and out.weights is not None
    with pytest.raises(ValueError, match="scores must have shape"):
        apply_policy(policy, out.state, batch, torch.rand(7), key=sbrandom.key(0), ids=2)
    with pytest.raises(ValueError, match="needs sample ids"):
        apply_policy(policy, out.state, batch, torch.rand(8), key=sbrandom.key(0))


def _recording(calls):
    def score_fn(rows):
        calls.append(rows.shape[0])
        return rows * 10

    return score_fn


def test_score_needed_forwards_only_rows_that_need_it():
    policy = stale_sb(1.0, num_ids=6, max_age=2)
    batch, ids = torch.arange(4.0), torch.tensor([0, 1, 2, 3])
    calls = []
    score_fn = _recording(calls)
    state = policy.init()
    scores, scored, forwarded = score_needed(policy, state, batch, ids, 0, score_fn)
    assert forwarded == 4 and scores.tolist() == [0.0, 10.0, 20.0, 30.0] and scored.all()
    _, state = policy.select(scores, state, key=sbrandom.key(0), ids=ids, epoch=0, scored=scored)
    ids2 = torch.tensor([1, 4, 3, 5])
    scores, scored, forwarded = score_needed(policy, state, batch, ids2, 1, score_fn)
    assert forwarded == 2 and calls == [4, 2]
    assert scored.tolist() == [False, True, False, True] and scores[[1, 3]].tolist() == [
        10.0,
        30.0,
    ]
    assert policy.score_rows(state, ids2, 1).tolist() == scored.tolist()
    scores, scored, forwarded = score_needed(policy, state, batch[:2], ids[:2], 1, score_fn)
    assert forwarded == 0 and calls == [4, 2] and not scored.any()
    # the epoch may come as a 0-d tensor (what a compiled step passes)
    scores, scored, forwarded = score_needed(policy, state, batch, ids2, torch.tensor(1), score_fn)
    assert forwarded == 2 and scores[[1, 3]].tolist() == [10.0, 30.0]
    with pytest.raises(ValueError, match="needs sample ids"):
        score_needed(policy, state, batch, None, 1, score_fn)


def test_score_needed_scores_every_row_for_policies_that_read_them_all():
    policy = jiang_cdf(1.0)
    assert policy.score_rows is None
    calls = []
    scores, scored, forwarded = score_needed(
        policy, policy.init(), torch.arange(3.0), None, 5, _recording(calls)
    )
    assert scored is None
    assert forwarded == 3 and calls == [3] and scores.tolist() == [0.0, 10.0, 20.0]


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from([0.5, -2.0, float("nan"), float("inf"), -float("inf")]),
            st.booleans(),  # a fresh score
            st.booleans(),  # kept
            st.booleans(),  # a finite input
        ),
        max_size=12,
    ),
    check_inputs=st.booleans(),
)
def test_unscorable_dropped_counts_the_left_out_rows_that_could_not_be_scored(rows, check_inputs):
    scores = torch.tensor([r[0] for r in rows])
    scored = torch.tensor([r[1] for r in rows], dtype=torch.bool)
    kept = torch.tensor([i for i, r in enumerate(rows) if r[2]], dtype=torch.int64)
    finite = torch.tensor([r[3] for r in rows], dtype=torch.bool) if check_inputs else None
    expected = sum(
        not r[2] and ((r[1] and not math.isfinite(r[0])) or (check_inputs and not r[3]))
        for r in rows
    )
    count = unscorable_dropped(scores, scored, kept, finite=finite)
    assert count.dtype == torch.int64 and count.shape == () and int(count) == expected
    everything = unscorable_dropped(scores, None, kept)  # every score fresh
    assert int(everything) == sum(not r[2] and not math.isfinite(r[0]) for r in rows)


def test_a_policy_written_for_1_0_takes_no_signals_argument():
    """A hand-built ``Policy(init, select)`` whose ``select`` predates ``signals=`` still runs:
    signals go only to a policy that ``needs`` them."""

    def select(scores, state, *, key, ids=None, epoch=0, elapsed=0.0, scored=None):
        return sbfunc.select.Selection(scores.argmax().reshape(1)), state

    policy = sbfunc.policies.Policy(lambda: (), select)
    out = sbfunc.selective_backprop.apply_policy(
        policy, (), (torch.arange(3),), torch.tensor([0.0, 2.0, 1.0]), key=sbfunc.random.key(0)
    )
    assert out.indices.tolist() == [1]
    wrapped = local_selection(policy)
    sel, _ = wrapped.select(torch.tensor([0.0, 2.0, 1.0]), (), key=sbfunc.random.key(0))
    assert sel.indices.tolist() == [1]
