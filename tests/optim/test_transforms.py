"""The building blocks: a chain's state mirrors its parts and its update is theirs in turn;
clip_by_global_norm bounds the global norm and leaves small updates bit for bit (torch's formula
and optax's exact one);
apply_updates adds, and a -0.0 update leaves every parameter bit for bit."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sbfunc import optim
from tests.helpers import assert_identical
from tests.optim.helpers import grad_sequence, model_params

SETTINGS = settings(max_examples=30, derandomize=True, database=None, deadline=None)
PARTS = {
    "clip": lambda: optim.clip_by_global_norm(0.5),
    "scale": lambda: optim.scale(-2.0),
    "l2": lambda: optim.add_decayed_weights(optim.constant_schedule(0.1)),
    "trace": lambda: optim.trace(0.9, dampening=0.2),
    "adam": lambda: optim.scale_by_adam(amsgrad=True),
    "lr": lambda: optim.scale_by_learning_rate(optim.cosine_decay_schedule(0.1, 3)),
    "decay": lambda: optim.decoupled_weight_decay(0.1, learning_rate=0.5),
}


@SETTINGS
@given(names=st.lists(st.sampled_from(sorted(PARTS)), min_size=0, max_size=4))
def test_a_chain_is_its_parts_in_turn(names):
    parts = [PARTS[n]() for n in names]
    opt = optim.chain(*parts)
    params = model_params()
    state = opt.init(params)
    assert len(state) == len(parts)
    assert_identical(state, tuple(t.init(params) for t in parts))
    states = [t.init(params) for t in parts]
    for g in grad_sequence(params, steps=3):
        updates, state = opt.update(g, state, params)
        for i, t in enumerate(parts):
            g, states[i] = t.update(g, states[i], params)
        assert_identical(updates, g)
        assert_identical(state, tuple(states))


def _global_norm(tree):
    return torch.linalg.vector_norm(torch.cat([t.double().reshape(-1) for t in tree.values()]))


@SETTINGS
@given(
    scale=st.floats(1e-3, 1e3),
    max_norm=st.floats(1e-2, 10.0),
    formula=st.sampled_from(["torch", "optax"]),
)
def test_clip_by_global_norm_bounds_the_norm(scale, max_norm, formula):
    grads = {k: v * scale for k, v in grad_sequence(model_params(), steps=1)[0].items()}
    grads["double"] = torch.ones(3, dtype=torch.float64) * scale
    opt = optim.clip_by_global_norm(max_norm, formula=formula)
    updates, _ = opt.update(grads, opt.init(grads))
    norm, before = float(_global_norm(updates)), float(_global_norm(grads))
    assert norm <= max_norm * (1 + 1e-6)
    within = before <= max_norm if formula == "optax" else before + 1e-6 <= max_norm
    if abs(before - max_norm) <= 1e-6 * max_norm:
        return  # at the bound: the test's norm and the transform's may round apart by an ulp
    if within:  # left bit for bit
        assert_identical(updates, grads)
    else:  # scaled down, direction kept
        rtol = 1e-6 if formula == "optax" else 1e-4
        torch.testing.assert_close(norm, max_norm, rtol=rtol, atol=0)


def test_clip_formulas_on_a_clipped_update_and_one_just_under_the_bound():
    # torch's max_norm / (norm + 1e-6) lands short of max_norm (here by 2.5e-6 relative) and
    # shrinks an update just under it; optax's max_norm / max(norm, max_norm) does neither
    max_norm = 1 / 3
    grads = {k: v * 0.1 for k, v in grad_sequence(model_params(), steps=1)[0].items()}
    grads = {k: v * (0.4 / float(_global_norm(grads))) for k, v in grads.items()}  # norm 0.4
    under = {k: v * (max_norm * (1 - 1e-6) / 0.4) for k, v in grads.items()}
    exact, torch_like = (
        optim.clip_by_global_norm(max_norm, formula=f) for f in ("optax", "torch")
    )
    clipped = float(_global_norm(exact.update(grads, exact.init(grads))[0]))
    assert abs(clipped / max_norm - 1) < 1e-6
    assert_identical(exact.update(under, exact.init(under))[0], under)
    short = float(_global_norm(torch_like.update(grads, torch_like.init(grads))[0]))
    assert short < max_norm * (1 - 2e-6)
    shrunk = torch_like.update(under, torch_like.init(under))[0]
    assert float(_global_norm(shrunk)) < float(_global_norm(under))
    assert repr(exact) == "clip_by_global_norm(max_norm=0.3333333333333333, formula='optax')"


def test_apply_updates_adds_and_negative_zero_updates_leave_params_bit_for_bit():
    params = {"a": torch.tensor([-0.0, 0.0, 1.5, float("nan")]), "b": torch.ones(2)}
    zeros = {k: torch.full_like(v, -0.0) for k, v in params.items()}
    assert_identical(optim.apply_updates(params, zeros), params)
    half = {"a": torch.full((4,), 0.5), "b": torch.full((2,), 0.5, dtype=torch.float64)}
    out = optim.apply_updates(params, half)
    assert out["b"].dtype == torch.float32 and torch.equal(out["b"], torch.full((2,), 1.5))
