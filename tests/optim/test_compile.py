"""One compiled update: Adam with a cosine schedule under torch.compile(fullgraph=True) equals
eager and compiles once (the step count and the scheduled lr stay tensors)."""

import torch
from torch._dynamo.utils import counters

from sbfunc import optim
from tests.optim.helpers import grad_sequence, model_params


def test_compiled_adam_with_cosine_schedule_matches_eager_without_recompiling():
    opt = optim.adam(optim.cosine_decay_schedule(1e-2, 4), weight_decay=1e-2, amsgrad=True)
    params = model_params()
    grads = grad_sequence(params, steps=5)  # past the schedule's end too
    torch._dynamo.reset()
    counters.clear()
    update = torch.compile(opt.update, fullgraph=True)
    eager_p, eager_s = params, opt.init(params)
    comp_p, comp_s = params, opt.init(params)
    for g in grads:
        eager_p, eager_s = opt.update(g, eager_s, eager_p)
        comp_p, comp_s = update(g, comp_s, comp_p)
        for k in params:
            torch.testing.assert_close(comp_p[k], eager_p[k], rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(comp_s, eager_s, rtol=1e-6, atol=1e-7)
    assert counters["stats"]["unique_graphs"] == 1
    torch._dynamo.reset()
