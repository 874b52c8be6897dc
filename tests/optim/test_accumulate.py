"""multi_steps: k chunks' gradients accumulated make one inner update on their mean (or sum),
with the parameters and inner state untouched in between, on both the eager branch and the
``torch.where`` path; optax's mixed-precision case (every call returns the inner update's
dtype)."""

from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sbfunc import optim
from sbfunc.optim._apply_if_finite import host_flag
from tests.helpers import assert_identical
from tests.optim.helpers import grad_sequence, model_params

SETTINGS = settings(max_examples=25, derandomize=True, database=None, deadline=None)


def _mean(chunks, k):
    total = chunks[0]
    for g in chunks[1:]:
        total = {n: total[n] + g[n] for n in total}
    return {n: v / k for n, v in total.items()}


@SETTINGS
@given(k=st.integers(1, 4), rounds=st.integers(1, 3), compiled_path=st.booleans())
def test_k_chunks_make_one_step_on_their_mean(k, rounds, compiled_path):
    path = (lambda flag: None) if compiled_path else host_flag  # torch.where, or a branch
    with mock.patch("sbfunc.optim._accumulate.host_flag", path):
        inner = optim.adamw(optim.linear_schedule(0.1, 0.01, 3), weight_decay=0.1, amsgrad=True)
        opt = optim.multi_steps(inner, k)
        params = model_params()
        grads = grad_sequence(params, steps=k * rounds)
        p, s = params, opt.init(params)
        p_ref, s_ref = params, inner.init(params)
        for r in range(rounds):
            chunks = grads[r * k : (r + 1) * k]
            for i, g in enumerate(chunks):
                updates, s = opt.update(g, s, p)
                p = optim.apply_updates(p, updates)
                if i < k - 1:  # in between: nothing moves
                    assert_identical(p, p_ref)
                    assert_identical(s.inner_state, s_ref)
                    assert int(s.mini_step) == i + 1
            u_ref, s_ref = inner.update(_mean(chunks, k), s_ref, p_ref)
            p_ref = optim.apply_updates(p_ref, u_ref)
            assert_identical(p, p_ref)
            assert_identical(s.inner_state, s_ref)
            assert int(s.mini_step) == 0 and int(s.gradient_step) == r + 1


def test_equal_chunks_of_a_batch_give_the_whole_batch_gradient():
    torch.manual_seed(0)
    w = torch.randn(3)
    x, y = torch.randn(12, 3), torch.randn(12)

    def grad(rows):
        return {"w": torch.func.grad(lambda w: ((x[rows] @ w - y[rows]) ** 2).mean())(w)}

    opt = optim.multi_steps(optim.sgd(0.1), 3)
    state, p = opt.init({"w": w}), {"w": w}
    for c in range(3):
        updates, state = opt.update(grad(slice(4 * c, 4 * c + 4)), state, p)
        p = optim.apply_updates(p, updates)
    whole = optim.apply_updates({"w": w}, optim.sgd(0.1).update(grad(slice(None)), ())[0])
    torch.testing.assert_close(p, whole, rtol=1e-6, atol=1e-7)


def test_unequal_chunks_scaled_by_their_share_and_summed():
    # what the training step's microbatching does: chunk i's mean-loss gradient times n_i / n
    grads = grad_sequence(model_params(), steps=3)
    sizes, n = (3, 3, 2), 8
    opt = optim.multi_steps(optim.sgd(1.0), 3, use_mean=False)
    state = opt.init(grads[0])
    scaled = [{k: v * (m / n) for k, v in g.items()} for g, m in zip(grads, sizes, strict=True)]
    for g in scaled:
        updates, state = opt.update(g, state)
    total = {k: scaled[0][k] + scaled[1][k] + scaled[2][k] for k in scaled[0]}
    assert_identical(updates, {k: v * -1.0 for k, v in total.items()})


def test_every_k_is_not_in_the_state():
    params = {"w": torch.zeros(2)}
    two, three = optim.multi_steps(optim.sgd(1.0), 2), optim.multi_steps(optim.sgd(1.0), 3)
    state = two.init(params)
    for _ in range(2):
        _, state = two.update({"w": torch.ones(2)}, state)
    for _ in range(3):
        updates, state = three.update({"w": torch.ones(2)}, state)
    assert torch.equal(updates["w"], torch.full((2,), -1.0)) and int(state.gradient_step) == 2


# optax _accumulation_test.OPTIMIZERS_TO_TEST
MIXED_PRECISION = {
    "adam": {"learning_rate": 0.1},
    "adam-mu_dtype": {"learning_rate": 0.1, "mu_dtype": torch.float32},
}
FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _dense_grads(params):
    """optax's ``Loss``: ``sum(Dense(10)(ones(32, 7)) ** 2)`` computed in float32 (flax's
    ``dtype``), its gradient in the parameters' dtype."""
    x = torch.ones(32, 7)
    y = x @ params["kernel"].float() + params["bias"].float()
    grads = {"kernel": x.T @ (2 * y), "bias": (2 * y).sum(0)}
    return {k: g.to(params[k].dtype) for k, g in grads.items()}


@pytest.mark.parametrize("compiled_path", [False, True], ids=["eager", "where"])
@pytest.mark.parametrize("name", sorted(MIXED_PRECISION))
def test_multi_steps_mixed_precision(name, compiled_path):
    # optax _accumulation_test.test_multi_steps_mixed_precision: k=4, k+1 steps for every
    # (gradient, parameter) dtype pair; each call's updates in the dtype of the plain
    # optimizer's updates, the parameters' dtype kept (1.1, eagerly: Adam with
    # mu_dtype=float32 returned float16/bfloat16 on the accumulating calls, float32 on the kth)
    k_steps = 4
    path = (lambda flag: None) if compiled_path else host_flag
    with mock.patch("sbfunc.optim._accumulate.host_flag", path):
        for upd_dtype in FLOATS:
            for param_dtype in FLOATS:
                opt = optim.adam(**MIXED_PRECISION[name])
                ms_opt = optim.multi_steps(optim.adam(**MIXED_PRECISION[name]), k_steps)
                torch.manual_seed(0)
                params = {"kernel": torch.randn(7, 10) / 7**0.5, "bias": torch.zeros(10)}
                params = {k: p.to(param_dtype) for k, p in params.items()}
                opt_state, ms_opt_state = opt.init(params), ms_opt.init(params)
                for _ in range(k_steps + 1):
                    grad = {k: g.to(upd_dtype) for k, g in _dense_grads(params).items()}
                    updates, opt_state = opt.update(grad, opt_state, params)
                    ms_updates, ms_opt_state = ms_opt.update(grad, ms_opt_state, params)
                    assert {k: u.dtype for k, u in updates.items()} == {
                        k: u.dtype for k, u in ms_updates.items()
                    }, (upd_dtype, param_dtype)
                    new_params = optim.apply_updates(params, ms_updates)
                    assert all(new_params[k].dtype == p.dtype for k, p in params.items())
                    params = new_params
