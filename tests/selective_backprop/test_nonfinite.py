"""Selective Backprop never makes a corrupt row vanish silently: the rows it leaves out because
they could not be scored (a non-finite score or input) count in ``rows_nonfinite`` like the
rows the step's guard masks (docs/how-to/failures.md)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import sbfunc
from sbfunc import random as sbrandom
from sbfunc.distributed import global_selection, local_selection

torch.manual_seed(0)
MODEL = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
PARAMS, BUFFERS = sbfunc.split_module(MODEL, clone=True)
LOSS = sbfunc.per_sample_loss(MODEL, F.cross_entropy)
SETTINGS = settings(max_examples=10, derandomize=True, database=None, deadline=None)

POLICIES = {
    "rank_power": lambda: sbfunc.policies.rank_power(0.5),
    "top_k": lambda: sbfunc.policies.top_k(0.5),
    "jiang": lambda: sbfunc.policies.jiang_cdf(1.0, history=16),
    "stale_sb": lambda: sbfunc.policies.stale_sb(1.0, num_ids=64, max_age=3),
    "local": lambda: local_selection(sbfunc.policies.rank_power(0.5)),
    "global": lambda: global_selection(sbfunc.policies.rank_power(0.5)),
    "global_rebalance": lambda: global_selection(sbfunc.policies.top_k(0.5), rebalance=True),
}


def _batch(n: int = 8, corrupt=(), value: float = float("nan"), seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    x[list(corrupt), 1] = value
    return x, (x.nan_to_num().sum(1) > 0).long(), torch.arange(n)


def _step(policy=None, nonfinite="skip"):
    sb = sbfunc.SelectiveBackprop(0.0, 1.0, interrupt=0, policy=policy, ids=2)
    step = sbfunc.make_train_step(LOSS, sbfunc.optim.sgd(0.1), [sb], nonfinite=nonfinite)
    return step, step.init(PARAMS, BUFFERS, key=sbrandom.key(0), total_steps=64)


def test_two_nan_input_rows_count_in_the_metrics_and_the_clock():
    step, state = _step()
    state, metrics = step(state, _batch(corrupt=[1, 5]))
    assert metrics.samples_backpropagated == 4  # rank-power keeps 4 of 8, the finite ones
    assert int(metrics.rows_nonfinite) == 2 and int(state.time.rows_nonfinite) == 2
    state, metrics = step(state, _batch(corrupt=[0, 2, 3], seed=1))
    assert int(metrics.rows_nonfinite) == 3 and int(state.time.rows_nonfinite) == 5
    state, metrics = step(state, _batch(seed=2))
    assert int(metrics.rows_nonfinite) == 0 and int(state.time.rows_nonfinite) == 5


@pytest.mark.parametrize("name", sorted(POLICIES))
@SETTINGS
@given(
    rows=st.sets(st.integers(0, 7), min_size=1, max_size=3),
    value=st.sampled_from([float("nan"), float("inf"), -float("inf")]),
)
def test_every_corrupt_row_counts_once_left_out_by_selection_or_masked(name, rows, value):
    # Invariant: with selection the count is the count without it, whether a corrupt row is
    # left out by the policy (counted here) or kept and masked by the step's guard.
    step, state = _step(POLICIES[name]())
    state, _ = step(state, _batch(seed=3))  # per-id policies remember these ids' losses
    after, metrics = step(state, _batch(corrupt=sorted(rows), value=value))
    assert int(metrics.rows_nonfinite) == len(rows)
    assert int(after.time.rows_nonfinite) == len(rows)
    assert all(torch.isfinite(p).all() for p in after.params.values())


def test_a_corrupt_row_stale_sb_did_not_score_still_counts():
    step, state = _step(sbfunc.policies.stale_sb(30.0, num_ids=64, max_age=5))
    state, _ = step(state, _batch(seed=4))  # every id's loss is cached: none is rescored
    lowest = state.algorithm_state[0].table.loss[:8].argsort()[:2].tolist()
    forwarded = state.time.samples_forwarded
    after, metrics = step(state, _batch(corrupt=lowest, seed=4))  # never scored, dropped
    assert after.time.samples_forwarded - forwarded == metrics.samples_backpropagated
    assert metrics.samples_backpropagated < 7  # the lowest cached losses are left out
    assert int(metrics.rows_nonfinite) == 2  # found by the input check, not by a score


def test_refill_counts_the_unscorable_rows_it_never_queues():
    def score(params, buffers, batch):  # ids 0, 3, 6 cannot be scored; inputs are finite
        return torch.where(batch[2] % 3 == 0, torch.nan, batch[0].sum(1))

    example = _batch()
    sb = sbfunc.SelectiveBackprop(
        0.0, 1.0, interrupt=0, policy=sbfunc.policies.top_k(0.75), refill=example,
        scoring=sbfunc.score.Scoring(loss_fn=score),
    )  # fmt: skip
    view = sbfunc.Context(sbrandom.key(0), PARAMS, BUFFERS, own=sb.init(sbrandom.key(0)))
    out = sb.apply(sbfunc.Event.AFTER_DATALOADER, view.replace(batch=example))
    _, queue = out.own
    assert queue.rows[2].tolist() == [1, 2, 4, 5, 7]  # 6 kept: the forced NaN row dropped
    assert int(out.rows_unscorable) == 3  # 2 not selected + 1 selected but never queued
    again = sb.apply(sbfunc.Event.AFTER_DATALOADER, out.replace(batch=example, own=out.own))
    assert int(again.rows_unscorable) == 6  # accumulates over the selections of a step


def test_nonfinite_raise_raises_for_rows_selection_left_out():
    step, state = _step(nonfinite="raise")
    with pytest.raises(FloatingPointError, match="2 of 8 rows"):
        step(state, _batch(corrupt=[1, 5]))


def test_nonfinite_allow_counts_nothing_as_documented():
    step, state = _step(nonfinite="allow")
    after, metrics = step(state, _batch(corrupt=[1, 5]))
    assert metrics.rows_nonfinite is None  # "None with nonfinite='allow'"
    assert int(after.time.rows_nonfinite) == 0 and metrics.samples_backpropagated == 4


def test_the_count_compiles_in_a_fullgraph_step():
    step, state = _step()
    step.compile(backend="eager", fullgraph=True)
    after, metrics = step(state, _batch(corrupt=[1, 5]))
    assert int(metrics.rows_nonfinite) == 2 and int(after.time.rows_nonfinite) == 2
