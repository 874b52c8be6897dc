"""The building blocks: a chain's state mirrors its parts and its update is theirs in turn;
clip_by_global_norm bounds the global norm and leaves small updates bit for bit;
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


@SETTINGS
@given(scale=st.floats(1e-3, 1e3), max_norm=st.floats(1e-2, 10.0))
def test_clip_by_global_norm_bounds_the_norm(scale, max_norm):
    grads = {k: v * scale for k, v in grad_sequence(model_params(), steps=1)[0].items()}
    grads["double"] = torch.ones(3, dtype=torch.float64) * scale
    opt = optim.clip_by_global_norm(max_norm)
    updates, _ = opt.update(grads, opt.init(grads))
    norm = torch.linalg.vector_norm(torch.cat([u.double().reshape(-1) for u in updates.values()]))
    before = torch.linalg.vector_norm(torch.cat([g.double().reshape(-1) for g in grads.values()]))
    assert float(norm) <= max_norm * (1 + 1e-5)
    if float(before) + 1e-6 <= max_norm:  # already within: left bit for bit
        assert_identical(updates, grads)
    else:  # scaled down, direction kept
        torch.testing.assert_close(float(norm), max_norm, rtol=1e-4, atol=0)


def test_apply_updates_adds_and_negative_zero_updates_leave_params_bit_for_bit():
    params = {"a": torch.tensor([-0.0, 0.0, 1.5, float("nan")]), "b": torch.ones(2)}
    zeros = {k: torch.full_like(v, -0.0) for k, v in params.items()}
    assert_identical(optim.apply_updates(params, zeros), params)
    half = {"a": torch.full((4,), 0.5), "b": torch.full((2,), 0.5, dtype=torch.float64)}
    out = optim.apply_updates(params, half)
    assert out["b"].dtype == torch.float32 and torch.equal(out["b"], torch.full((2,), 1.5))
