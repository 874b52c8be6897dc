"""The two states: functional updates, step.init's TrainState, pytrees and checkpoints."""

import io

import optree
import pytest
import torch
from hypothesis import given, settings

import sbfunc
from sbfunc import checkpoint
from sbfunc.engine import Context, Event, Time, TrainState, named_sequence, sequence
from sbfunc.testing import Toy, linear_loss, states, train_states
from tests.helpers import assert_identical

FAST = settings(max_examples=25, derandomize=True, deadline=None, database=None)


class Stateful(Toy):
    """Keeps the key it was initialised with and a count."""

    def init(self, key):
        return {"key": key, "count": 0}

    def match(self, event, state):
        return event == Event.INIT

    def apply(self, event, state):
        return state.replace(own={**state.own, "count": state.own["count"] + 1})


def make_step(algorithms=()):
    return sbfunc.make_train_step(linear_loss, sbfunc.optim.sgd(0.1), algorithms)


def test_replace_is_functional_and_names_unknown_fields(view0, train0):
    new = view0.replace(loss=torch.tensor(2.0), time=Time(step=1))
    assert view0.loss is None and view0.time.step == 0 and new.time.step == 1
    with pytest.raises(TypeError, match="Context has no field 'lr'"):
        view0.replace(lr=0.1)
    assert train0.replace(time=Time(step=2)).time.step == 2 and train0.time.step == 0
    with pytest.raises(TypeError, match="TrainState has no field 'batch'"):
        train0.replace(batch=())


def test_the_train_state_holds_only_what_persists():
    assert TrainState._fields == (
        "params",
        "buffers",
        "key",
        "opt_state",
        "algorithm_state",
        "time",
    )
    per_batch = {"batch", "outputs", "loss", "losses", "grads", "sample_weights", "scratch"}
    assert per_batch <= set(Context._fields) and not per_batch & set(TrainState._fields)


def test_time_as_tensors_mirrors_the_host_time():
    host = Time(step=7, epoch=2, batch_in_epoch=3, elapsed=0.25, total_steps=28)
    clock = host.as_tensors()
    assert (clock.step.dtype, clock.epoch.dtype, clock.elapsed.dtype) == (
        torch.int64,
        torch.int64,
        torch.float32,
    )
    assert (int(clock.step), int(clock.epoch), float(clock.elapsed)) == (7, 2, 0.25)
    assert (int(clock.batch_in_epoch), int(clock.total_steps)) == (3, 28)
    assert Time().as_tensors().total_steps is None  # unknown length stays unknown


def test_time_advances_elapsed_from_the_run_length():
    t = Time(step=2, total_steps=4).advanced(forwarded=8, backpropagated=4)
    assert (t.step, t.batch_in_epoch, t.elapsed) == (3, 1, 0.75)
    assert (t.samples_forwarded, t.samples_backpropagated) == (8, 4)
    assert Time(step=2).advanced(forwarded=0, backpropagated=0).elapsed == 0.0


def test_init_copies_inputs_and_mirrors_the_algorithm_list():
    params, buffers = {"weight": torch.ones(3, 2), "bias": torch.zeros(3)}, {"n": torch.ones(1)}
    key = sbfunc.random.key(1)
    algs = [
        Stateful(name="a"),
        Toy(name="stateless"),
        sequence(Stateful(name="b"), Stateful(name="b")),
        named_sequence(x=Stateful(), y=Toy()),
        Stateful(name="a"),  # same name twice: allowed, its own entry
    ]
    step = make_step(algs)
    state = step.init(params, buffers, key=key)
    assert state.params == params and state.params is not params
    assert state.buffers == buffers and state.buffers is not buffers
    assert torch.equal(state.key, key) and state.time.step == 0
    assert int(state.time.updates_skipped) == 0 and state.time.updates_skipped.dtype == torch.int64
    assert_identical(state.opt_state, sbfunc.optim.sgd(0.1).init(params))
    a, toy, (b0, b1), named, a1 = state.algorithm_state
    assert len(state.algorithm_state) == len(algs) and toy == (0,)  # INIT fired once
    assert set(named) == {"x", "y"} and named["y"] == (0,)
    # INIT fired once for each Stateful too; every one got its own key
    counts = [s["count"] for s in (a, b0, b1, named["x"], a1)]
    keys = [s["key"] for s in (a, b0, b1, named["x"], a1)]
    assert counts == [1] * 5
    assert len({tuple(k.tolist()) for k in keys}) == 5
    assert all(sbfunc.random.is_key(k) and not torch.equal(k, key) for k in keys)


def test_init_is_deterministic_per_key_and_independent_of_other_algorithms():
    def init_key(algs, index, seed=0):
        state = make_step(algs).init({}, {}, key=sbfunc.random.key(seed))
        return state.algorithm_state[index]["key"]

    alone = init_key([Stateful(name="s")], 0)
    assert torch.equal(init_key([Stateful(name="s")], 0), alone)
    assert torch.equal(init_key([Toy(), Stateful(name="s")], 1), alone)
    assert torch.equal(init_key([Stateful(name="s"), Stateful(name="t")], 0), alone)
    assert not torch.equal(init_key([Stateful(name="s")], 0, seed=1), alone)


def test_init_validates():
    step = make_step()
    with pytest.raises(TypeError, match="key"):
        step.init({}, {}, key=0)
    with pytest.raises(TypeError, match="params must be a dict"):
        step.init([torch.ones(1)], {}, key=sbfunc.random.key(0))
    with pytest.raises(TypeError, match="buffers must be a dict"):
        step.init({}, {"n": 1}, key=sbfunc.random.key(0))
    with pytest.raises(TypeError, match=r"algorithms\[0\] must be an sbfunc.Algorithm"):
        make_step([object()])


@FAST
@given(states())
def test_state_is_a_pytree(state):
    leaves, spec = optree.tree_flatten(state, none_is_leaf=True)
    assert_identical(optree.tree_unflatten(spec, leaves), state)
    copied = optree.tree_map(lambda x: x.clone() if torch.is_tensor(x) else x, state)
    assert type(copied) is Context and type(copied.time) is Time
    assert_identical(copied, state)


@FAST
@given(train_states(num_algorithms=2))
def test_train_state_round_trips_through_a_weights_only_checkpoint(state):
    state = state.replace(algorithm_state=({"count": 3, "w": torch.ones(2)}, ()))
    buf = io.BytesIO()
    checkpoint.save(state, buf)
    buf.seek(0)
    loaded = checkpoint.load(buf, like=state)
    assert type(loaded) is TrainState and type(loaded.time) is Time
    assert_identical(loaded, state)


def test_a_state_between_steps_loads_against_a_fresh_init_template():
    algs = [Stateful(name="a"), sequence(Stateful(), Toy(events=[Event.INIT]))]
    step = make_step(algs)
    params = {"weight": torch.zeros(3, 2), "bias": torch.zeros(3)}
    state = step.init(params, {}, key=sbfunc.random.key(4))
    batch = (torch.randn(5, 2), torch.tensor([0, 1, 2, 0, 1]))
    for _ in range(2):
        state, _ = step(state, batch)
    buf = io.BytesIO()
    checkpoint.save(state, buf)
    template = make_step(algs).init(params, {}, key=sbfunc.random.key(0))
    loaded = checkpoint.load(io.BytesIO(buf.getvalue()), like=template)
    assert_identical(loaded, state)
    assert_identical(step(loaded, batch)[0], step(state, batch)[0])  # continues identically
    other = make_step([Stateful(name="a")]).init(params, {}, key=sbfunc.random.key(0))
    with pytest.raises(checkpoint.CheckpointError, match="structure"):
        checkpoint.load(io.BytesIO(buf.getvalue()), like=other)
