"""Two gloo ranks (spawned processes, bounded in time) against one process.

One launch runs every scenario of ``common.SCENARIOS``, the traffic measurement, the resume
check and a token selection on both ranks; the tests compare its results with one-process
references computed here.
"""

import optree
import pytest
import torch

import sbfunc
from sbfunc import distributed as sbdist
from tests.distributed import common, job
from tests.helpers import assert_identical

TIMEOUT_S = 300  # the checks take seconds; this only stops a hung run


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ranks")
    return job.launch(
        ["scenarios", "traffic", "resume", "nonfinite", "tokens", "frozen"],
        out,
        timeout_s=TIMEOUT_S,
    )


def _leaves(tree):
    return optree.tree_leaves(tree, none_is_leaf=True)


def _assert_close(a, b):
    for x, y in zip(_leaves(a), _leaves(b), strict=True):
        if isinstance(x, torch.Tensor):
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5, equal_nan=True)
        else:
            assert x == y


@pytest.mark.parametrize("name", sorted(common.SCENARIOS))
def test_two_ranks_equal_one_process_on_the_concatenated_batch(ranks, name):
    """Global: one selection over the global batch; local: each rank's own selection (the
    reference replays the ranks' parts); the gradient is the mean over all kept rows."""
    reference = common.run(*common.build(common.SCENARIOS[name], None), rank=0, world=1)
    for results in ranks:
        records = results["scenarios"][name]
        assert len(records) == len(reference) == common.EPOCHS * common.N // 16
        for mine, ref in zip(records, reference, strict=True):
            _assert_close(mine.params, ref.params)
            _assert_close(mine.loss, ref.loss)
            _assert_close(mine.policy_state, ref.policy_state)


@pytest.mark.parametrize("name", sorted(common.SCENARIOS))
def test_state_is_identical_on_every_rank(ranks, name):
    first, second = (r["scenarios"][name] for r in ranks)
    for a, b in zip(first, second, strict=True):
        assert_identical(a.params, b.params)
        assert_identical(a.policy_state, b.policy_state)
        assert_identical(a.loss, b.loss)


def test_a_rank_without_kept_rows_still_takes_the_update(ranks):
    first, second = (r["scenarios"]["global_empty_rank"] for r in ranks)
    assert [r.rows for r in first] == [8] * len(first)
    assert [r.rows for r in second] == [0] * len(second)


@pytest.mark.parametrize(
    "name", ["global_jiang_rebalance", "local_jiang_rebalance", "global_empty_rank_rebalance"]
)
def test_rebalancing_evens_the_backpropagated_rows(ranks, name):
    first, second = (r["scenarios"][name] for r in ranks)
    assert all(abs(a.rows - b.rows) <= 1 for a, b in zip(first, second, strict=True))
    assert all(a.rows >= b.rows for a, b in zip(first, second, strict=True))


def test_measured_traffic_equals_the_prediction(ranks):
    for rank, results in enumerate(ranks):
        totals = results["traffic"]["totals"]
        params = results["traffic"]["params"].values()
        row = 6 * 4 + 8 + 8  # x: 6 float32, y: int64, ids: int64
        expected = {
            "gradients": sbdist.gradient_traffic(params, world=2, bucket_bytes=104),
            "sizes": sbdist.gather_traffic(1, 8, world=2),
            "scores": sbdist.gather_traffic(common.BATCH, 4, world=2),
            "rebalance": sbdist.rebalance_traffic([8, 0], row, rank=rank),
        }
        assert totals == expected
        assert expected["rebalance"].received == (0 if rank == 0 else 4 * row)


def test_resume_is_bit_for_bit_on_every_rank(ranks):
    for results in (r["resume"] for r in ranks):
        assert results["full"].time.step == results["steps"]
        assert_identical(results["resumed"], results["full"])
        assert_identical(results["loaded"], results["half"])
        assert results["mismatches"] == []
    queues = [r["resume"]["half"].algorithm_state[0][1].rows[0].shape[0] for r in ranks]
    times = [r["resume"]["full"].time.samples_backpropagated for r in ranks]
    assert len(set(queues)) > 1 or len(set(times)) > 1  # the ranks' local parts do differ


def test_a_non_finite_loss_on_one_rank_skips_or_raises_on_every_rank(ranks):
    for results in ranks:
        assert results["nonfinite"]["skip"] == (True, True)  # skipped, parameters unchanged
        assert "not finite on some rank" in results["nonfinite"]["raise"]


def test_token_selection_selects_on_each_rank_and_averages_the_ranks_updates(ranks):
    """Local token selection: each rank keeps half of its own tokens, so one SGD step on two
    ranks (equal token counts) is the mean of each rank's own one-process step."""
    loss_fn, params, buffers = common.token_model()
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.5), [common.token_selection()])
    alone = [
        step(step.init(params, buffers, key=common.KEY), common.token_batch(r))[0].params
        for r in range(common.WORLD)
    ]
    expected = {k: sum(a[k] for a in alone) / common.WORLD for k in params}
    for results in ranks:
        for k, v in expected.items():
            torch.testing.assert_close(results["tokens"]["params"][k], v, rtol=1e-5, atol=1e-6)
        assert not torch.equal(results["tokens"]["params"]["wte.weight"], params["wte.weight"])


def test_frozen_parameters_stay_frozen_and_are_never_synchronised(ranks):
    """Issue 40, item 1: a frozen parameter, given in the buffers, neither changes nor travels
    as a buffer (the model has no other buffer: nothing of purpose "buffers" moves)."""
    for results in ranks:
        frozen = results["frozen"]
        for name, before in frozen["before"].items():
            assert torch.equal(before, frozen["after"][name]), name
        assert "buffers" not in frozen["traffic"]
