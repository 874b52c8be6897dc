"""Compiled updates: under torch.compile(fullgraph=True) an update equals eager and compiles
once (the step counts and the scheduled values stay tensors). The wrappers' compiled path
(``torch.where`` selects) is checked against their eager CPU path (a host branch)."""

import pytest
import torch
from torch._dynamo.utils import counters

from sbfunc import optim
from tests.optim.helpers import grad_sequence, model_params


def _compare_compiled(opt, grads, params):
    torch._dynamo.reset()
    counters.clear()
    update = torch.compile(opt.update, fullgraph=True)
    eager_p, eager_s = params, opt.init(params)
    comp_p, comp_s = params, opt.init(params)
    for g in grads:
        eager_u, eager_s = opt.update(g, eager_s, eager_p)
        comp_u, comp_s = update(g, comp_s, comp_p)
        eager_p = optim.apply_updates(eager_p, eager_u)
        comp_p = optim.apply_updates(comp_p, comp_u)
        torch.testing.assert_close(comp_u, eager_u, rtol=1e-6, atol=1e-7, equal_nan=True)
        torch.testing.assert_close(comp_p, eager_p, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(comp_s, eager_s, rtol=1e-6, atol=1e-7)
    assert counters["stats"]["unique_graphs"] == 1
    torch._dynamo.reset()


def test_compiled_adam_with_cosine_schedule_matches_eager_without_recompiling():
    opt = optim.adam(optim.cosine_decay_schedule(1e-2, 4), weight_decay=1e-2, amsgrad=True)
    params = model_params()
    _compare_compiled(opt, grad_sequence(params, steps=5), params)  # past the schedule's end


def test_compiled_adam_with_bfloat16_gradients_of_float32_parameters():
    # the cast to the parameters' dtype is part of the graph: no host sync, one graph
    opt = optim.adam(optim.cosine_decay_schedule(1e-2, 4), weight_decay=1e-2)
    params = model_params()
    grads = [
        {k: g.to(torch.bfloat16) for k, g in gs.items()} for gs in grad_sequence(params, steps=3)
    ]
    _compare_compiled(opt, grads, params)


@pytest.mark.parametrize("wrap", ["apply_if_finite", "multi_steps"])
def test_compiled_wrappers_match_their_eager_branches_without_recompiling(wrap):
    inner = optim.chain(
        optim.clip_by_global_norm(1.0),
        optim.sgd(optim.linear_schedule(0.1, 0.01, 4), momentum=0.9, weight_decay=1e-3),
    )
    if wrap == "apply_if_finite":
        opt = optim.apply_if_finite(inner, max_consecutive_errors=2)
    else:
        opt = optim.multi_steps(optim.apply_if_finite(inner), 2)
    params = model_params()
    grads = grad_sequence(params, steps=6)
    grads[1] = {
        k: torch.full_like(v, float("nan")) if i == 0 else v
        for i, (k, v) in enumerate(grads[1].items())
    }
    grads[2] = {k: v * float("inf") for k, v in grads[2].items()}  # two in a row
    _compare_compiled(opt, grads, params)
