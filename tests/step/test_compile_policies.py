"""``step.compile(fullgraph=True)`` with Selective Backprop under every fixed-count rule: one
graph, the eager step's parameters (issue 41: the torch matrix runs these on every release).

Loshchilov is left out: it scores only the rows it does not remember (a data-dependent
size), so it is not a fullgraph rule. DivBS and Bayesian selection compile in
``tests/policies/test_bayesian.py``, rank-power with other algorithms in ``test_compile.py``.
These trace with ``aot_eager`` (dynamo's and AOTAutograd's graphs, not inductor's code): what
can break between torch releases.
"""

import pytest
import torch
import torch.nn.functional as F

import sbfunc
from sbfunc import policies

N, IDS = 16, 32
RULES = {
    "rank_power": lambda: policies.rank_power(0.5),
    "top_k": lambda: policies.top_k(0.25),
    "random_subset": lambda: policies.random_subset(0.5),
    "grad_norm_fixed": lambda: policies.grad_norm_importance(0.5, switch=False, fixed_size=True),
    "rho_loss": lambda: policies.rho_loss(0.5, torch.linspace(0, 1, IDS)),
}


def _batch(t: int):
    g = torch.Generator().manual_seed(t)
    x, y = torch.randn(N, 4, generator=g), torch.randint(0, 3, (N,), generator=g)
    return x, y, torch.arange(N) + N * (t % 2)


def _run(rule: str, compiled: bool, steps: int = 3):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(8, 3)
    )
    sb = sbfunc.SelectiveBackprop(0.0, 1.0, interrupt=0, policy=RULES[rule](), ids=2)
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.adam(1e-2), [sb])
    if compiled:
        step.compile(backend="aot_eager", fullgraph=True)
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))
    kept = []
    for t in range(steps):
        state, metrics = step(state, _batch(t))
        kept.append(metrics.samples_backpropagated)
    return state, kept


@pytest.mark.parametrize("rule", sorted(RULES))
def test_selective_backprop_compiles_fullgraph_with_every_fixed_count_rule(rule):
    torch._dynamo.reset()
    eager, eager_kept = _run(rule, compiled=False)
    compiled, compiled_kept = _run(rule, compiled=True)
    assert compiled_kept == eager_kept
    for key, value in eager.params.items():
        torch.testing.assert_close(compiled.params[key], value, rtol=1e-5, atol=1e-6)
