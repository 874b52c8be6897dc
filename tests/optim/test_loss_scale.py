"""``dynamic_loss_scale``: GradScaler's scale schedule as a gradient transformation. Finite
gradients update as the inner transformation does, bit for bit; an overflow skips the update
(``-0.0``, inner state untouched) and backs the scale off; ``growth_interval`` finite updates
in a row grow it, as ``torch.amp.GradScaler`` does."""

from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sbfunc import optim
from tests.helpers import assert_identical
from tests.optim.helpers import grad_sequence, model_params

INF = float("inf")


def _overflowed(grads):
    return {k: torch.full_like(g, INF) if i == 0 else g for i, (k, g) in enumerate(grads.items())}


def test_init_holds_gradscalers_defaults_and_the_inner_state():
    params = model_params()
    state = optim.dynamic_loss_scale(optim.adam(1e-3)).init(params)
    scaler = torch.amp.GradScaler("cpu")
    assert state.scale.dtype == torch.float32 and state.scale.item() == scaler.get_scale()
    assert state.good_steps.dtype == torch.int64 and state.good_steps.item() == 0
    assert_identical(state.inner, optim.adam(1e-3).init(params))
    assert optim.loss_scale(state) is state.scale
    assert optim.loss_scale(optim.adam(1e-3).init(params)) is None


def test_an_overflow_skips_the_update_keeps_the_inner_state_and_backs_off():
    params, grads = model_params(), grad_sequence(model_params(), steps=2)
    opt = optim.dynamic_loss_scale(optim.adam(1e-2, weight_decay=0.1), init_scale=1024.0)
    _, state = opt.update(grads[0], opt.init(params), params)
    assert state.good_steps.item() == 1
    updates, after = opt.update(_overflowed(grads[1]), state, params)
    assert all(torch.equal(u, torch.full_like(u, -0.0)) for u in updates.values())
    assert all(u.signbit().all() for u in updates.values())  # -0.0: parameters bit for bit
    assert_identical(optim.apply_updates(params, updates), params)
    assert_identical(after.inner, state.inner)
    assert after.scale.item() == 512.0 and after.good_steps.item() == 0


@pytest.mark.parametrize("interval", [1, 3])
def test_the_scale_grows_after_growth_interval_finite_updates(interval):
    params, grads = model_params(), grad_sequence(model_params(), steps=2 * interval)
    opt = optim.dynamic_loss_scale(optim.sgd(0.1), init_scale=8.0, growth_interval=interval)
    state, scales = opt.init(params), []
    for g in grads:
        _, state = opt.update(g, state, params)
        scales.append(state.scale.item())
    assert scales == [8.0] * (interval - 1) + [16.0] * interval + [32.0]


def test_the_scale_follows_gradscaler_step_by_step():
    # the same finite/overflow sequence through torch.amp.GradScaler's own update
    flags = [True, True, False, True, True, True, False, False, True, True]
    opt = optim.dynamic_loss_scale(optim.sgd(0.1), growth_interval=2, growth_factor=4.0)
    scaler = torch.amp.GradScaler("cpu", growth_interval=2, growth_factor=4.0)
    w = torch.nn.Parameter(torch.ones(2))
    sgd = torch.optim.SGD([w], lr=0.1)
    params = {"w": torch.ones(2)}
    state = opt.init(params)
    for finite in flags:
        g = torch.ones(2) if finite else torch.tensor([1.0, INF])
        sgd.zero_grad()
        scaler.scale(w.sum()).backward()  # the scaled gradient, then overwritten by hand
        w.grad = g * scaler.get_scale()
        scaler.step(sgd)
        scaler.update()
        _, state = opt.update({"w": g}, state, params)
        assert state.scale.item() == scaler.get_scale()


def test_the_scale_stops_growing_where_it_would_overflow():
    opt = optim.dynamic_loss_scale(optim.sgd(0.1), init_scale=2.0**127, growth_interval=1)
    params = {"w": torch.ones(1)}
    _, state = opt.update({"w": torch.ones(1)}, opt.init(params), params)
    assert state.scale.item() == 2.0**127 and state.good_steps.item() == 0


@settings(max_examples=25, derandomize=True, database=None, deadline=None)
@given(power=st.integers(-20, 24), steps=st.integers(1, 4))
def test_finite_updates_equal_the_inner_updates_for_any_scale(power, steps):
    params, grads = model_params(), grad_sequence(model_params(), steps=steps)
    inner = optim.adamw(1e-2)
    opt = optim.dynamic_loss_scale(inner, init_scale=2.0**power)
    ours, theirs = opt.init(params), inner.init(params)
    for g in grads:
        u, ours = opt.update(g, ours, params)
        v, theirs = inner.update(g, theirs, params)
        assert_identical(u, v)
        assert_identical(ours.inner, theirs)


@pytest.mark.parametrize("finite", [True, False])
def test_the_select_path_equals_the_branch(finite):
    # on an accelerator or compiled, the flag is not read on the host: torch.where selects
    params, grads = model_params(), grad_sequence(model_params(), steps=2)
    opt = optim.dynamic_loss_scale(optim.sgd(0.1, momentum=0.9), init_scale=4.0)
    _, state = opt.update(grads[0], opt.init(params), params)
    g = grads[1] if finite else _overflowed(grads[1])
    branch = opt.update(g, state, params)
    with mock.patch("sbfunc.optim._apply_if_finite.host_flag", lambda flag: None):
        select = opt.update(g, state, params)
    assert_identical(select, branch)
    assert branch[1].scale.item() == (4.0 if finite else 2.0)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"init_scale": 0.0}, ValueError),
        ({"init_scale": INF}, ValueError),
        ({"growth_factor": 1.0}, ValueError),
        ({"backoff_factor": 1.0}, ValueError),
        ({"backoff_factor": 0.0}, ValueError),
        ({"growth_interval": 0}, ValueError),
        ({"growth_interval": 2.5}, TypeError),
        ({"init_scale": "big"}, TypeError),
    ],
)
def test_bad_arguments_raise_naming_them(kwargs, error):
    with pytest.raises(error, match=next(iter(kwargs))):
        optim.dynamic_loss_scale(optim.sgd(0.1), **kwargs)
    with pytest.raises(TypeError, match="inner"):
        optim.dynamic_loss_scale(torch.optim.SGD)  # type: ignore[arg-type]


def test_repr_reads_as_the_call():
    opt = optim.dynamic_loss_scale(optim.sgd(0.1), growth_interval=10)
    assert repr(opt).startswith("dynamic_loss_scale(sgd(lr=0.1")
    assert "growth_interval=10" in repr(opt)
