"""multi_steps(should_skip_update_fn=...) and its skip functions: optax's _accumulation_test
cases (test_skip_not_finite, test_skip_large_updates, test_multi_steps_skip_not_finite), the
law that a skipped micro-step is never accumulated, on the eager branch and the torch.where
path, and the accumulator kept in another dtype."""

import functools
import math
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sbfunc import optim
from sbfunc.optim._apply_if_finite import host_flag
from tests.helpers import assert_identical

SETTINGS = settings(max_examples=25, derandomize=True, database=None, deadline=None)
STEP = torch.zeros((), dtype=torch.int64)


def _tree(first):
    return {"a": torch.tensor(first), "b": torch.zeros(())}


@pytest.mark.parametrize(
    ("value", "skip"), [(math.inf, True), (-math.inf, True), (math.nan, True), (11.0, False)]
)
def test_skip_not_finite(value, skip):
    should_skip, state = optim.skip_not_finite(_tree(value), STEP, None)
    assert bool(should_skip) is skip and bool(state["should_skip"]) is skip
    assert int(state["num_not_finite"]) == int(skip)


@pytest.mark.parametrize(
    ("value", "skip", "norm_squared"),
    [
        (math.inf, True, math.inf),
        (math.nan, True, math.nan),
        (11.0, True, 121.0),
        (0.0, False, 0.0),
    ],
)
def test_skip_large_updates(value, skip, norm_squared):
    should_skip, state = optim.skip_large_updates(_tree(value), STEP, None, 100.0)
    assert bool(should_skip) is skip and bool(state["should_skip"]) is skip
    got = float(state["norm_squared"])
    assert got == norm_squared or (math.isnan(got) and math.isnan(norm_squared))


@pytest.mark.parametrize("compiled_path", [False, True])
def test_multi_steps_skip_not_finite(compiled_path):
    # optax test_multi_steps_skip_not_finite
    path = (lambda flag: None) if compiled_path else host_flag
    with mock.patch("sbfunc.optim._accumulate.host_flag", path):
        opt = optim.multi_steps(optim.sgd(1.0), 2, should_skip_update_fn=optim.skip_not_finite)
        params = {"a": torch.zeros(())}
        state = opt.init(params)

        def step(g, mini_step):
            nonlocal params, state
            updates, state = opt.update({"a": torch.tensor(g)}, state, params)
            assert int(state.mini_step) == mini_step
            params = optim.apply_updates(params, updates)

        step(1.0, 1)
        step(1.0, 0)
        assert params["a"].item() == -1.0
        step(math.inf, 0)  # no increase in mini_step
        assert params["a"].item() == -1.0 and int(state.skip_state["num_not_finite"]) == 1
        step(math.nan, 0)
        assert params["a"].item() == -1.0
        step(1.0, 1)
        step(1.0, 0)
        assert params["a"].item() == -2.0 and int(state.gradient_step) == 2


def _chunks(draw_values):
    return [{"w": torch.tensor(v, dtype=torch.float32)} for v in draw_values]


FINITE = st.floats(-10, 10, width=32)
VALUES = st.one_of(FINITE, st.sampled_from([math.inf, -math.inf, math.nan]))


@SETTINGS
@given(
    values=st.lists(st.lists(VALUES, min_size=2, max_size=2), min_size=1, max_size=8),
    k=st.integers(1, 3),
    compiled_path=st.booleans(),
)
def test_skip_not_finite_never_accumulates_a_non_finite_micro_step(values, k, compiled_path):
    path = (lambda flag: None) if compiled_path else host_flag
    with mock.patch("sbfunc.optim._accumulate.host_flag", path):
        inner = optim.adam(0.1)
        opt = optim.multi_steps(inner, k, should_skip_update_fn=optim.skip_not_finite)
        skip_free = optim.multi_steps(inner, k)
        params = {"w": torch.zeros(2)}
        p, s, p_ref, s_ref = params, opt.init(params), params, skip_free.init(params)
        for g in _chunks(values):
            u, s = opt.update(g, s, p)
            p = optim.apply_updates(p, u)
            assert all(torch.isfinite(t).all() for t in s.acc_grads.values())
            if bool(torch.isfinite(g["w"]).all()):  # only the finite ones, in order
                u_ref, s_ref = skip_free.update(g, s_ref, p_ref)
                p_ref = optim.apply_updates(p_ref, u_ref)
            else:
                assert_identical(u, {"w": torch.full((2,), -0.0)})
            assert_identical(p, p_ref)
            assert_identical(s._replace(skip_state=()), s_ref)


def test_skip_large_updates_with_its_bound_bound():
    skip = functools.partial(optim.skip_large_updates, max_squared_norm=4.0)
    opt = optim.multi_steps(optim.sgd(1.0), 1, should_skip_update_fn=skip)
    params = {"w": torch.zeros(2)}
    state = opt.init(params)
    assert set(state.skip_state) == {"should_skip", "norm_squared"}
    big, _ = opt.update({"w": torch.tensor([3.0, 0.0])}, state, params)
    small, state = opt.update({"w": torch.tensor([1.0, 1.0])}, state, params)
    assert_identical(big, {"w": torch.full((2,), -0.0)})
    assert torch.equal(small["w"], torch.tensor([-1.0, -1.0]))
    assert float(state.skip_state["norm_squared"]) == 2.0


def test_a_should_skip_that_is_not_a_0d_bool_raises():
    def bad(updates, gradient_step, params):
        return torch.tensor([True]), ()

    opt = optim.multi_steps(optim.sgd(1.0), 2, should_skip_update_fn=bad)
    params = {"w": torch.zeros(1)}
    with pytest.raises(ValueError, match="should_skip a 0-d bool tensor"):
        opt.update(params, opt.init(params), params)


@pytest.mark.parametrize("compiled_path", [False, True])
@pytest.mark.parametrize("kept", [torch.bfloat16, torch.float64])
def test_accumulator_dtype(kept, compiled_path):
    # the sum is computed in the wider dtype, only the stored accumulator rounded (optax's
    # accumulator_dtype); the inner update sees the gradients' dtype
    path = (lambda flag: None) if compiled_path else host_flag
    with mock.patch("sbfunc.optim._accumulate.host_flag", path):
        opt = optim.multi_steps(optim.sgd(1.0), 3, use_mean=False, accumulator_dtype=kept)
        params = {"w": torch.zeros(3)}
        state = opt.init(params)
        assert state.acc_grads["w"].dtype == kept
        grads = [torch.tensor([1.0, 1e-3, 1 / 3]), torch.tensor([2.0, 1e-3, 1 / 3])]
        for g in grads:
            _, state = opt.update({"w": g}, state, params)
        wide = torch.promote_types(kept, torch.float32)
        expected = (grads[0].to(kept).to(wide) + grads[1].to(wide)).to(kept)
        assert_identical(state.acc_grads["w"], expected)
        updates, state = opt.update({"w": torch.ones(3)}, state, params)
        assert updates["w"].dtype == torch.float32
        assert_identical(state.acc_grads["w"], torch.full((3,), -0.0, dtype=kept))


def test_reprs_and_checks():
    opt = optim.multi_steps(optim.sgd(0.1), 2)
    assert repr(opt) == (
        "multi_steps(inner=sgd(lr=0.1, momentum=0.0, dampening=0.0, nesterov=False, "
        "weight_decay=0.0, maximize=False), every_k=2, use_mean=True)"
    )
    with pytest.raises(TypeError, match="should_skip_update_fn must be callable"):
        optim.multi_steps(optim.sgd(0.1), 2, should_skip_update_fn=1)
    with pytest.raises(TypeError, match="accumulator_dtype must be None"):
        optim.multi_steps(optim.sgd(0.1), 2, accumulator_dtype="float32")
    with pytest.raises(ValueError, match="max_squared_norm must be"):
        optim.skip_large_updates({"w": torch.ones(1)}, STEP, None, -1.0)
