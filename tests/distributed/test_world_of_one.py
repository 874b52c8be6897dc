"""Without a process group everything in sbfunc.distributed is a world of one: the
data-parallel step is the plain step, the scopes are the plain selection."""

import optree
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc import distributed as sbdist
from sbfunc.distributed._comm import buckets
from sbfunc.step import ONE_PROCESS
from tests.distributed import common


def test_comm_is_a_world_of_one_and_never_mutates():
    comm = sbdist.Comm(meter=sbdist.TrafficMeter())
    x = torch.arange(4.0)
    out = comm.all_reduce_sum([x, torch.ones(2, dtype=torch.int64)], scale=2)
    assert out[0].tolist() == [0.0, 2.0, 4.0, 6.0] and out[1].tolist() == [2, 2]
    assert comm.broadcast([x])[0] is not x and comm.all_gather(x) is not x
    assert torch.equal(comm.all_to_all(x, [4], [4]), x) and x.tolist() == [0, 1, 2, 3]
    assert comm.meter.totals() == {}  # nothing moved


def test_comm_arguments_are_checked():
    with pytest.raises(TypeError, match=r"meter must be an sbfunc\.distributed\.TrafficMeter"):
        sbdist.Comm(meter=object())
    with pytest.raises(ValueError, match=r"torch\.distributed is not initialised"):
        sbdist.Comm(group=object())


@settings(max_examples=40, derandomize=True, database=None, deadline=None)
@given(
    sizes=st.lists(st.tuples(st.integers(0, 40), st.booleans()), min_size=1, max_size=8),
    cap=st.integers(1, 200),
)
def test_buckets_cover_every_tensor_once_by_dtype_within_the_cap(sizes, cap):
    tensors = [torch.zeros(n, dtype=torch.float32 if f else torch.int64) for n, f in sizes]
    groups = buckets(tensors, cap)
    assert sorted(i for g in groups for i in g) == list(range(len(tensors)))
    for g in groups:
        assert len({tensors[i].dtype for i in g}) == 1 and g == sorted(g)
        assert len(g) == 1 or sum(tensors[i].numel() * tensors[i].element_size() for i in g) <= cap


@pytest.mark.parametrize("name", ["global_infobatch", "global_jiang_rebalance", "local_stale_sb"])
def test_the_data_parallel_step_of_one_equals_the_plain_step(name):
    scenario = common.SCENARIOS[name]
    if scenario.kind == "local":  # a local selection of one folds rank 0 into the key
        scenario = scenario._replace(kind="global")
    plain = common.run(*common.build(scenario, None), rank=0, world=1)
    parallel = common.run(*common.build(scenario, sbdist.Comm()), rank=0, world=1)
    for a, b in zip(plain, parallel, strict=True):
        assert a.rows == b.rows
        torch.testing.assert_close(a.params, b.params, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(a.policy_state, b.policy_state, rtol=1e-5, atol=1e-6)


def test_a_step_with_no_row_anywhere_skips_the_update():
    net = common.model()
    loss_fn = sbfunc.per_sample_loss(net, F.cross_entropy, mode="train")
    x, y = common.data()
    policy = sbdist.local_selection(sbfunc.policies.jiang_cdf(1.0))
    sb = sbfunc.SelectiveBackprop(0.0, 1.0, interrupt=0, policy=policy, refill=(x[:16], y[:16]))
    step = sbdist.make_data_parallel_step(loss_fn, sbfunc.optim.adam(1e-2), [sb])
    state = step.init(*sbfunc.split_module(net, clone=True), key=common.KEY)
    new, metrics = step(state, (x[:4], y[:4]))  # at most 4 rows queued: no full batch of 16
    assert metrics.samples_backpropagated == 0 and bool(metrics.skipped)
    assert int(new.time.updates_skipped) == 1 and torch.isnan(metrics.loss)
    assert all(torch.equal(new.params[k], state.params[k]) for k in state.params)
    for a, b in zip(
        optree.tree_leaves(new.opt_state), optree.tree_leaves(state.opt_state), strict=True
    ):
        assert torch.equal(a, b)


def test_step_arguments_are_checked():
    loss_fn = sbfunc.per_sample_loss(common.model(), F.cross_entropy)
    opt = sbfunc.optim.sgd(0.1)
    with pytest.raises(ValueError, match="bucket_mb must be a finite float > 0, got 0"):
        sbdist.make_data_parallel_step(loss_fn, opt, bucket_mb=0)
    with pytest.raises(ValueError, match="buffers must be 'broadcast' or 'mean', got 'sum'"):
        sbdist.make_data_parallel_step(loss_fn, opt, buffers="sum")
    with pytest.raises(TypeError, match=r"comm must be an sbfunc\.distributed\.Comm"):
        sbdist.make_data_parallel_step(loss_fn, opt, comm="world")
    with pytest.raises(TypeError, match=r"comm must be an sbfunc\.distributed\.Comm"):
        sbdist.DataParallel(comm="world")
    with pytest.raises(TypeError, match=r"replicas must be sbfunc\.step\.ONE_PROCESS"):
        sbfunc.make_train_step(loss_fn, opt, replicas="ddp")


def test_data_parallel_is_a_component_of_the_ordinary_step():
    """No subclass: the data-parallel step is a TrainStep whose replicas is a DataParallel,
    and both ways of building it give the same step."""
    loss_fn = sbfunc.per_sample_loss(common.model(), F.cross_entropy)
    opt = sbfunc.optim.sgd(0.1)
    shorthand = sbdist.make_data_parallel_step(loss_fn, opt, bucket_mb=1.0, buffers="mean")
    direct = sbfunc.make_train_step(
        loss_fn, opt, replicas=sbdist.DataParallel(bucket_mb=1.0, buffers="mean")
    )
    assert type(shorthand) is type(direct) is sbfunc.step.TrainStep
    for dp in (shorthand.replicas, direct.replicas):
        assert (dp.bucket_bytes, dp.buffers, dp.comm.world) == (2**20, "mean", 1)
    assert sbfunc.make_train_step(loss_fn, opt).replicas is ONE_PROCESS


@pytest.mark.parametrize("wrap", [sbdist.local_selection, sbdist.global_selection])
def test_selection_wrappers_check_their_arguments(wrap):
    top = sbfunc.policies.top_k(0.5)
    with pytest.raises(TypeError, match=r"policy must be an sbfunc\.policies\.Policy"):
        wrap("global")
    with pytest.raises(TypeError, match="rebalance must be True or False"):
        wrap(top, rebalance=1)
    with pytest.raises(TypeError, match=r"comm must be an sbfunc\.distributed\.Comm"):
        wrap(top, comm="world")
    with pytest.raises(ValueError, match="already a data-parallel selection"):
        wrap(wrap(top, rebalance=True))
    with pytest.raises(ValueError, match="scores every row"):
        wrap(top).select(torch.rand(4), (), key=sbfunc.random.key(0), scored=torch.ones(4) > 0)


@pytest.mark.parametrize("wrap", [sbdist.local_selection, sbdist.global_selection])
@pytest.mark.parametrize("rebalance", [False, True])
def test_a_wrapped_policy_of_one_process_selects_like_the_policy(wrap, rebalance):
    """A world of one: global selection is the policy itself; local selection folds rank 0
    into the key. Rebalancing moves nothing."""
    policy = sbfunc.policies.jiang_cdf(1.0, history=16)
    wrapped = wrap(policy, rebalance=rebalance)
    assert wrapped.score_rows is None and wrapped.record is None
    assert (wrapped.prune is not None) == rebalance
    scores, key = torch.rand(12), sbfunc.random.key(3)
    inner_key = sbfunc.random.fold_in(key, 0) if wrap is sbdist.local_selection else key
    want, want_state = policy.select(scores, policy.init(), key=inner_key)
    batch = (torch.arange(12.0)[:, None], torch.arange(12))
    out = sbfunc.selective_backprop.apply_policy(wrapped, wrapped.init(), batch, scores, key=key)
    assert torch.equal(out.indices, want.indices) and torch.equal(out.batch[1], want.indices)
    assert torch.equal(out.state.values, want_state.values)


def test_rebalancing_refuses_a_per_sample_spec():
    wrapped = sbdist.global_selection(sbfunc.policies.top_k(0.5), rebalance=True)
    with pytest.raises(ValueError, match="per_sample is not supported with rebalance"):
        sbfunc.selective_backprop.apply_policy(
            wrapped, (), (torch.zeros(4, 2),), torch.rand(4), key=sbfunc.random.key(0),
            per_sample=(True,),
        )  # fmt: skip


def test_per_rank_draws_from_the_key_folded_with_the_rank():
    cutout = sbdist.per_rank(sbfunc.algorithms.CutOut(length=0.5))
    assert cutout.name == "CutOut" and cutout.parts[0].name == "CutOut"
    key = sbfunc.random.key(5)
    state = sbfunc.Context(key, batch=(torch.ones(4, 1, 8, 8),))
    got = cutout.apply(sbfunc.Event.AFTER_DATALOADER, state)
    want = sbfunc.algorithms.CutOut(length=0.5).apply(
        sbfunc.Event.AFTER_DATALOADER, state.replace(key=sbdist.rank_key(key, 0))
    )
    assert torch.equal(got.batch[0], want.batch[0]) and torch.equal(got.key, key)
    with pytest.raises(TypeError, match="algorithm must be an sbfunc Algorithm"):
        sbdist.per_rank(lambda s: s)
    with pytest.raises(ValueError, match="rank must be an int >= 0, got -1"):
        sbdist.rank_key(key, -1)


def test_rank_local_parts_split_off_and_join_back():
    x, y = common.data()
    queue = sbfunc.selective_backprop.enqueue(
        sbfunc.selective_backprop.empty_queue((x[:2], y[:2])), (x[:3], y[:3])
    )
    state = sbfunc.TrainState(
        {"w": torch.ones(2)}, {}, common.KEY, algorithm_state=((None, queue), None),
        time=sbfunc.Time(step=5, samples_forwarded=30, samples_backpropagated=12),
    )  # fmt: skip
    shared, local = sbdist.split_state(state)
    assert local.queues == (queue,) and (
        local.samples_forwarded,
        local.samples_backpropagated,
    ) == (30, 12)
    assert (
        sbfunc.batch.batch_size(shared.algorithm_state[0][1].rows) == 0 and shared.time.step == 5
    )
    joined = sbdist.join_state(shared, local)
    assert joined.time == state.time and torch.equal(joined.algorithm_state[0][1].rows[0], x[:3])
    with pytest.raises(ValueError, match="local has 0 queues for a state with 1 refill queues"):
        sbdist.join_state(shared, local._replace(queues=()))


def test_save_and_load_in_a_world_of_one(tmp_path):
    step, state = common.build(common.SCENARIOS["global_infobatch"], sbdist.Comm())
    x, y = common.data()
    state, _ = step(state, (x[:8], y[:8], torch.arange(8)))
    sbdist.save_data_parallel(state, tmp_path / "one.pt")
    loaded = sbdist.load_data_parallel(
        tmp_path / "one.pt", like=common.build(common.SCENARIOS["global_infobatch"], None)[1]
    )
    assert loaded.time == state.time and all(
        torch.equal(loaded.params[k], state.params[k]) for k in state.params
    )
    assert torch.equal(loaded.algorithm_state[0].loss, state.algorithm_state[0].loss)


def test_traffic_predictions_of_one_rank_are_zero():
    assert sbdist.gradient_traffic([torch.zeros(3)], world=1) == sbdist.Traffic()
    assert sbdist.gather_traffic(8, 12, world=1) == sbdist.Traffic()
    assert sbdist.rebalance_traffic([5], 40, rank=0) == sbdist.Traffic()
    with pytest.raises(ValueError, match="world must be an int >= 1, got 0"):
        sbdist.gather_traffic(8, 12, world=0)


def test_per_rank_keeps_the_part_s_flags_and_takes_the_step_s_loss():
    sb = sbfunc.SelectiveBackprop(start=0.0, end=1.0, keep=0.5)  # scores with the step's loss
    wrapped = sbdist.per_rank(sb)
    for field in ("selects_samples", "uses_key", "uses_elapsed", "events"):
        assert getattr(wrapped, field) == getattr(sb, field), field
    model = torch.nn.Linear(3, 2)
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1), [wrapped])
    assert step.algorithms[0].part.loss_fn is not None and wrapped.part.loss_fn is None
    state = step.init(*sbfunc.split_module(model), key=sbfunc.random.key(0), total_steps=2)
    state, metrics = step(state, (torch.randn(8, 3), torch.randint(0, 2, (8,))))
    assert int(metrics.samples_backpropagated) == 4  # scored with the step's loss, half kept
