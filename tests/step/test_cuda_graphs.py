"""What a CPU can prove of ``step.compile(mode="reduce-overhead")`` (CUDA graphs, issue 41,
item 4): the core compiles as one graph (``fullgraph=True``: no host read, which would break
it), and no tensor inside that graph lives on the CPU when the step's state lives on a device
(a CPU tensor inside a CUDA graph makes torch skip the graph: every step would replay
nothing). The ``meta`` device stands in for the accelerator: a graph traced from meta inputs
whose values include a CPU tensor fails here. The GPU benchmark (``benchmarks/gpu.py``) times
the graphs themselves.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

import sbfunc
from sbfunc.selective_backprop import TokenSelection
from tests.helpers import lm_loss, tiny_lm
from tests.meta import META, to_meta

pytestmark = pytest.mark.slow


class _Devices:
    """A backend recording the devices of every value of every graph dynamo makes, then
    running it as it is (on meta: shapes only)."""

    def __init__(self) -> None:
        self.graphs = 0
        self.devices: set[str] = set()

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        self.graphs += 1
        for node in gm.graph.nodes:
            value = node.meta.get("example_value")
            values = value if isinstance(value, tuple | list) else (value,)
            for v in values:
                if isinstance(v, torch.Tensor):
                    self.devices.add(f"{v.device.type}:{node.op}:{node.target}")
        return gm.forward


def _classifier(algorithms: list[Any]) -> tuple[Any, Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    step = sbfunc.make_train_step(
        sbfunc.per_sample_loss(model, F.cross_entropy), sbfunc.optim.adamw(1e-3), algorithms
    )
    g = torch.Generator().manual_seed(0)
    batch = (torch.randn(16, 4, generator=g), torch.randint(0, 3, (16,), generator=g))
    return step, model, batch


def _language_model(algorithms: list[Any]) -> tuple[Any, Any, Any]:
    model = tiny_lm(9)
    step = sbfunc.make_train_step(lm_loss(model), sbfunc.optim.adamw(1e-3), algorithms)
    ids = torch.randint(0, 257, (6, 9), generator=torch.Generator().manual_seed(0))
    return step, model, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


CASES = {
    "plain": lambda: _classifier([]),
    "sb_rank_power": lambda: _classifier([sbfunc.SelectiveBackprop(0.0, 1.0, keep=0.5)]),
    "tokens_uniform": lambda: _language_model([TokenSelection(0.6, score="uniform")]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_compiled_core_holds_no_cpu_tensor_and_reads_nothing_on_the_host(case):
    step, model, batch = CASES[case]()
    devices = _Devices()
    step.compile(backend=devices, fullgraph=True)
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0),
                      total_steps=10)  # fmt: skip
    state, batch = to_meta(state), to_meta(batch)
    _, metrics = step(state, batch)
    assert devices.graphs == 1 and metrics.loss.device == META
    cpu = sorted(d for d in devices.devices if d.startswith("cpu"))
    assert not cpu, f"CPU tensors inside the graph: {cpu}"


def test_the_check_catches_a_cpu_tensor():
    """The same check on a step whose algorithm makes a CPU tensor inside the core fails."""

    class OnTheHost(sbfunc.Algorithm):
        events = frozenset({sbfunc.Event.AFTER_LOSS})

        def apply(self, event, ctx):
            return ctx.replace(loss=ctx.loss + torch.zeros(()).to(ctx.loss.device))

    step, model, batch = _classifier([OnTheHost()])
    devices = _Devices()
    step.compile(backend=devices, fullgraph=True)
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))
    step(to_meta(state), to_meta(batch))
    assert any(d.startswith("cpu") for d in devices.devices)


def test_reduce_overhead_compiles_and_matches_eager_on_the_cpu():
    """On the CPU inductor has no CUDA graph to make: the mode compiles and equals eager."""
    top_k = [sbfunc.SelectiveBackprop(0.0, 1.0, policy=sbfunc.policies.top_k(0.5))]
    step, model, batch = _classifier(top_k)
    eager, _, _ = _classifier(top_k)
    step.compile(mode="reduce-overhead", fullgraph=True)
    init = sbfunc.split_module(model, clone=True)
    a = eager.init(*init, key=sbfunc.random.key(0))
    b = step.init(*init, key=sbfunc.random.key(0))
    for _ in range(2):
        a, _ = eager(a, batch)
        b, _ = step(b, batch)
    for k in a.params:
        torch.testing.assert_close(a.params[k], b.params[k], rtol=1e-5, atol=1e-6)
