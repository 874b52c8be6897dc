"""State: functional update, construction with algorithm state, pytree and checkpoint."""

import io

import optree
import pytest
import torch
from hypothesis import given, settings

import sbfunc
from sbfunc.engine import State, Time, chain, init_state, load_state_dict, state_dict
from sbfunc.testing import Toy, states

FAST = settings(max_examples=25, derandomize=True, deadline=None, database=None)


class Stateful(Toy):
    def init(self, key):
        return {"key": key, "count": 0}


def test_replace_is_functional_and_names_unknown_fields(state0):
    new = state0.replace(loss=torch.tensor(2.0), time=Time(step=1))
    assert state0.loss is None and state0.time.step == 0 and new.time.step == 1
    with pytest.raises(TypeError, match="'lr'"):
        state0.replace(lr=0.1)


def test_init_state_copies_inputs_and_fills_algorithm_state():
    params = {"w": torch.ones(2)}
    key = sbfunc.random.key(1)
    algs = [
        Stateful(name="a"),
        Toy(name="stateless"),
        chain(Stateful(name="b"), Stateful(name="b")),
    ]
    state = init_state(params, {}, key=key, algorithms=algs)
    assert state.params == params and state.params is not params
    assert sorted(state.algorithm_state) == ["a", "b", "b#1"]
    keys = [state.algorithm_state[n]["key"] for n in ("a", "b", "b#1")]
    assert len({int(k) for k in keys}) == 3
    assert torch.equal(state.key, key)


def test_init_state_validates():
    with pytest.raises(TypeError, match="key"):
        init_state({}, {}, key=0)
    with pytest.raises(TypeError, match="Algorithm"):
        init_state({}, {}, key=sbfunc.random.key(0), algorithms=[object()])
    with pytest.raises(ValueError, match="'s'"):
        init_state({}, {}, key=sbfunc.random.key(0), algorithms=[Stateful(name="s")] * 2)


def assert_trees_equal(a, b):
    flat_a, spec_a = optree.tree_flatten(a, none_is_leaf=True)
    flat_b, spec_b = optree.tree_flatten(b, none_is_leaf=True)
    assert spec_a == spec_b
    for x, y in zip(flat_a, flat_b, strict=True):
        assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y


@FAST
@given(states())
def test_state_is_a_pytree(state):
    leaves, spec = optree.tree_flatten(state, none_is_leaf=True)
    assert_trees_equal(optree.tree_unflatten(spec, leaves), state)
    copied = optree.tree_map(lambda x: x.clone() if torch.is_tensor(x) else x, state)
    assert type(copied) is State and type(copied.time) is Time
    assert_trees_equal(copied, state)


@FAST
@given(states())
def test_state_dict_round_trips_through_weights_only_load(state):
    state = state.replace(algorithm_state={"a": {"count": 3, "w": torch.ones(2)}})
    buf = io.BytesIO()
    torch.save(state_dict(state), buf)
    buf.seek(0)
    assert_trees_equal(load_state_dict(torch.load(buf, weights_only=True)), state)


def test_load_state_dict_names_unknown_keys(state0):
    d = state_dict(state0)
    d["extra"] = 1
    with pytest.raises(TypeError, match="'extra'"):
        load_state_dict(d)
