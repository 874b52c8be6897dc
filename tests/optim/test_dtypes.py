"""Parameters of other dtypes: complex parameters (Adam on real views, as torch.optim.Adam)
converge on optax's complex parabola, and gradients of another dtype than the parameters
(bfloat16 or float16 gradients of float32 parameters, and the reverse) give what the same
gradients cast to the parameters' dtype give, bit for bit, with states and updates in the
parameters' dtype. Torch parity on complex parameters: ``test_torch_parity.py``."""

import optree
import pytest
import torch

from sbfunc import optim
from tests.helpers import assert_identical
from tests.optim.helpers import grad_sequence, model_params

ADAMS = {
    "adam": lambda: optim.adam(0.1),
    "adam-amsgrad": lambda: optim.adam(0.1, amsgrad=True),
    "adamw": lambda: optim.adamw(0.1, weight_decay=0.0),
    "decoupled_adamw": lambda: optim.decoupled_adamw(0.1, weight_decay=0.0),
}


def _parabola_grad(z, final):
    """torch's gradient of ``sum(|z - final|**2)`` (``2 * (z - final)``)."""
    z = z.detach().requires_grad_(True)
    (z - final).abs().square().sum().backward()
    return z.grad


@pytest.mark.parametrize("name", sorted(ADAMS))
def test_adam_converges_on_the_complex_parabola(name):
    # optax's alias_test parabola in complex64: from [-1, 10, 1] to [1, -1, 1] * (1 + 1j).
    # Before the real views, adam ended at [1+1j, -1-1j, 1.0000-2.6662j] after 10,000 steps
    # (the second moment summed g * g, not |g|**2); now it is within 1e-6 after 1,000.
    final = torch.tensor([1.0, -1.0, 1.0], dtype=torch.complex64) * (1 + 1j)
    opt = ADAMS[name]()
    params = {"z": torch.tensor([-1.0, 10.0, 1.0], dtype=torch.complex64)}
    state = opt.init(params)
    for _ in range(1000):
        updates, state = opt.update({"z": _parabola_grad(params["z"], final)}, state, params)
        params = optim.apply_updates(params, updates)
    assert params["z"].dtype == torch.complex64
    torch.testing.assert_close(params["z"], final, rtol=0, atol=1e-2)


def test_amsgrad_keeps_complex_state_like_torch():
    opt = optim.adam(0.1, amsgrad=True)
    params = {"z": torch.zeros(2, dtype=torch.complex64)}
    grads = {"z": torch.tensor([3 + 4j, -1j], dtype=torch.complex64)}
    _, state = opt.update(grads, opt.init(params), params)
    # per part: (1 - b2) * re**2 and (1 - b2) * im**2, as torch's view_as_real state
    expected = torch.tensor([9e-3 + 16e-3j, 1e-3j], dtype=torch.complex64)
    for v in (state.exp_avg_sq["z"], state.max_exp_avg_sq["z"]):
        torch.testing.assert_close(v, expected)


OPTIMIZERS = {
    "adam": lambda: optim.adam(1e-2, weight_decay=0.1),
    "adam-amsgrad-maximize": lambda: optim.adam(1e-2, amsgrad=True, maximize=True),
    "adamw": lambda: optim.adamw(1e-2),
    "decoupled_adamw": lambda: optim.decoupled_adamw(1e-2),
    "sgd": lambda: optim.sgd(0.1),
    "sgd-momentum": lambda: optim.sgd(0.1, momentum=0.9, dampening=0.2, weight_decay=0.1),
    "sgd-nesterov": lambda: optim.sgd(0.1, momentum=0.9, nesterov=True),
    "decoupled_sgdw": lambda: optim.decoupled_sgdw(0.1, momentum=0.9, weight_decay=1e-2),
    "adam-schedule": lambda: optim.adam(optim.cosine_decay_schedule(1e-2, 3)),
    "multi_steps": lambda: optim.multi_steps(optim.adam(1e-2), 2),
    "apply_if_finite": lambda: optim.apply_if_finite(optim.sgd(0.1, momentum=0.9)),
    "trace": lambda: optim.trace(0.9),
    "scale_by_adam": lambda: optim.scale_by_adam(),
}
PAIRS = [  # (parameters, gradients)
    (torch.float32, torch.bfloat16),
    (torch.bfloat16, torch.float32),
    (torch.float32, torch.float16),
    (torch.float16, torch.float32),
]


def _tensors(tree):
    return [t for t in optree.tree_leaves(tree) if t.is_floating_point()]


@pytest.mark.parametrize(("param_dtype", "grad_dtype"), PAIRS, ids=str)
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_gradients_of_another_dtype_are_cast_to_the_parameters_dtype(
    name, param_dtype, grad_dtype
):
    opt = OPTIMIZERS[name]()
    params = {k: v.to(param_dtype) for k, v in model_params().items()}
    grads = grad_sequence(model_params(), steps=4)
    if name == "apply_if_finite":  # a skipped step's updates too
        grads[1] = {k: torch.full_like(v, float("nan")) for k, v in grads[1].items()}
    mixed = [{k: g.to(grad_dtype) for k, g in gs.items()} for gs in grads]
    same = [{k: g.to(param_dtype) for k, g in gs.items()} for gs in mixed]  # cast by hand
    p_mixed, s_mixed = params, opt.init(params)
    p_same, s_same = params, opt.init(params)
    for g_mixed, g_same in zip(mixed, same, strict=True):
        u_mixed, s_mixed = opt.update(g_mixed, s_mixed, p_mixed)
        u_same, s_same = opt.update(g_same, s_same, p_same)
        assert_identical(u_mixed, u_same)  # updates in the parameters' dtype, as by hand
        assert_identical(s_mixed, s_same)  # so is the state
        p_mixed = optim.apply_updates(p_mixed, u_mixed)
        p_same = optim.apply_updates(p_same, u_same)
    assert all(t.dtype == param_dtype for t in _tensors((p_mixed, u_mixed, s_mixed)))


def test_the_building_blocks_cast_to_their_state_without_parameters():
    for opt in (optim.trace(0.9), optim.scale_by_adam(amsgrad=True)):
        state = opt.init({"w": torch.ones(3)})
        updates, state = opt.update({"w": torch.ones(3, dtype=torch.bfloat16)}, state)
        assert updates["w"].dtype == torch.float32
        assert all(t.dtype == torch.float32 for t in _tensors(state))
