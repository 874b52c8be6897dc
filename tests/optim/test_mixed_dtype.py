"""optax's mixed-precision cases, ported: the optimizers return updates in the parameters'
dtype (optax ``alias_test.test_preserve_dtype``), also for gradients of another floating dtype
than the parameters (issue 27: ``adam`` raised ``expected dtype Half for `end` but got float``
in ``_foreach_lerp`` for float16 parameters and float32 gradients), also wrapped in
``multi_steps`` (optax ``test_gradient_accumulation``) and in ``dynamic_loss_scale``, whose
skipped calls return the inner update's dtype. The bit-for-bit comparison with gradients cast
by hand is ``test_dtypes.py``'s."""

import gc
from unittest import mock

import pytest
import torch

from sbfunc import optim
from sbfunc.optim._apply_if_finite import _SKIPPED, host_flag
from tests.helpers import assert_identical

OPTIMIZERS = {
    "sgd": lambda: optim.sgd(0.1),
    "sgd-momentum": lambda: optim.sgd(0.1, momentum=0.9, weight_decay=1e-2),
    "adam": lambda: optim.adam(1e-2),
    "adam-wd": lambda: optim.adam(1e-2, weight_decay=1e-2, amsgrad=True),
    "adamw": lambda: optim.adamw(1e-2),
}
FLOATS = [torch.float32, torch.bfloat16, torch.float16]
PAIRS = [(p, g) for p in FLOATS for g in FLOATS]  # (parameters, gradients), same ones too


def _grads(params, dtype):
    """optax's ``jax.grad(lambda x: sum(x**2))``, in ``dtype``."""
    return {k: (2 * p.float()).to(dtype) for k, p in params.items()}


def _check_steps(opt, params, grad_dtype, steps=3):
    """``steps`` updates: each in the parameters' dtype, the parameters finite after them."""
    state, start = opt.init(params), params
    for _ in range(steps):
        updates, state = opt.update(_grads(params, grad_dtype), state, params)
        assert all(u.dtype == params[k].dtype for k, u in updates.items())
        params = optim.apply_updates(params, updates)
    assert all(p.dtype == start[k].dtype and bool(p.isfinite().all()) for k, p in params.items())
    return params


@pytest.mark.parametrize(("param_dtype", "grad_dtype"), PAIRS, ids=str)
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_updates_come_in_the_parameters_dtype(name, param_dtype, grad_dtype):
    params = {"a": torch.tensor([1.0, 2.0], dtype=param_dtype), "b": torch.ones(2, 3)}
    params["b"] = params["b"].to(param_dtype)
    after = _check_steps(OPTIMIZERS[name](), params, grad_dtype)
    assert all(bool((after[k].float() < params[k].float()).all()) for k in params)  # descends


def test_the_reported_failure_float16_parameters_float32_gradients():
    params = {"w": torch.tensor([1.0, -2.0], dtype=torch.float16)}
    opt = optim.adam(0.1)
    updates, state = opt.update({"w": torch.tensor([2.0, -4.0])}, opt.init(params), params)
    assert updates["w"].dtype == torch.float16 and state.exp_avg["w"].dtype == torch.float16
    torch.testing.assert_close(updates["w"], torch.tensor([-0.1, 0.1], dtype=torch.float16))


@pytest.mark.parametrize(("param_dtype", "grad_dtype"), PAIRS, ids=str)
@pytest.mark.parametrize(
    "wrap",
    [
        lambda o: optim.multi_steps(o, 2),
        lambda o: optim.dynamic_loss_scale(o, init_scale=2.0**10),
        lambda o: optim.apply_if_finite(o),
    ],
    ids=["multi_steps", "dynamic_loss_scale", "apply_if_finite"],
)
def test_wrapped_optimizers_keep_the_parameters_dtype(wrap, param_dtype, grad_dtype):
    params = {"w": torch.tensor([1.0, 2.0], dtype=param_dtype)}
    _check_steps(wrap(optim.adamw(1e-2)), params, grad_dtype, steps=4)


SKIPPING = {
    "apply_if_finite": (optim.apply_if_finite, "_apply_if_finite"),
    "dynamic_loss_scale": (optim.dynamic_loss_scale, "_apply_if_finite"),
    "multi_steps-skip_not_finite": (
        lambda o: optim.multi_steps(o, 1, should_skip_update_fn=optim.skip_not_finite),
        "_accumulate",
    ),
}


@pytest.mark.parametrize("compiled_path", [False, True], ids=["eager", "where"])
@pytest.mark.parametrize("name", sorted(SKIPPING))
def test_a_skipped_call_returns_the_inner_updates_dtype(name, compiled_path):
    # optax's wrappers select from (or eval_shape) the inner update: Adam with
    # mu_dtype=float32 updates float16 parameters in float32, skipped calls included
    wrap, module = SKIPPING[name]
    opt = wrap(optim.adam(0.1, mu_dtype=torch.float32))
    params = {"w": torch.tensor([1.0, 2.0], dtype=torch.float16)}
    path = (lambda flag: None) if compiled_path else host_flag
    with mock.patch(f"sbfunc.optim.{module}.host_flag", path):
        state = opt.init(params)
        for g in (1.0, float("nan"), 1.0, float("nan")):
            updates, state = opt.update({"w": torch.full((2,), g)}, state, params)
            assert updates["w"].dtype == torch.float32, g
            if g != g:  # skipped: -0.0, which leaves the parameters bit for bit
                assert_identical(optim.apply_updates(params, updates), params)


def test_the_skipped_dtypes_are_found_once_and_go_with_the_optimizer():
    opt = optim.multi_steps(optim.adam(0.1, mu_dtype=torch.float32), 3)
    params = {"w": torch.ones(2, dtype=torch.bfloat16)}
    state = opt.init(params)
    owner = id(opt.update.__self__)
    for _ in range(2):
        _, state = opt.update({"w": torch.ones(2)}, state, params)
    assert list(_SKIPPED[owner].values()) == [{"w": torch.float32}]  # one layout, one run
    del opt
    gc.collect()
    assert owner not in _SKIPPED
