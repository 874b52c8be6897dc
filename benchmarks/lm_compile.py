"""Compile time of a language model's step (issue 41, item 3): what ``step.compile()``'s first
call costs against a compiled hand-written step, and where every extra second goes.

Each variant compiles in a fresh child process with an empty inductor cache
(``TORCHINDUCTOR_CACHE_DIR`` set to a new folder), so no compile warms another:

* ``hand``: a pure step written by hand, ``torch.compile(fullgraph=True)``: ``functional_call``
  of the model, Hugging Face's causal LM loss, ``torch.func.grad_and_value``, AdamW in tensor
  ops (torch.optim's formulas), the same model and batch;
* ``sbfunc plain``: ``make_train_step(loss_fn, adamw)`` then ``step.compile()``;
* ``sbfunc tokens``: the same with ``TokenSelection(0.6, score="uniform")``.

For each it reports the first call's seconds (compile included), the graphs dynamo made, their
FX nodes (the graph's size: what AOT autograd and inductor work through), recompiles, and
dynamo's own phase times (``torch._dynamo.utils.compile_times``): tracing, AOT autograd,
inductor. Target: ``sbfunc plain`` within 2x ``hand``.

Run: ``python benchmarks/lm_compile.py`` (``--layers``, ``--width``; a few minutes on 2 CPU
cores under ``flock /tmp/sbfunc-timing.lock``; ``--quick``: ``backend="aot_eager"``, seconds).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # a shared machine: see compiled_step.py

import argparse
import json
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch
import torch.nn.functional as F

import sbfunc

LENGTH, BATCH, VOCAB = 64, 8, 257
VARIANTS = ("hand", "sbfunc plain", "sbfunc tokens")


def model(layers: int, width: int) -> sbfunc.models.CausalLM:
    return sbfunc.models.CausalLM(
        d_model=width, num_heads=2, num_layers=layers, max_len=LENGTH, key=sbfunc.random.key(0)
    )


def batch() -> dict[str, torch.Tensor]:
    ids = sbfunc.random.randint(sbfunc.random.key(7), (BATCH, LENGTH), 0, VOCAB)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def hand_step(net: torch.nn.Module, lr: float = 1e-3, wd: float = 0.01) -> Any:
    """A pure AdamW step on Hugging Face's loss (torch.optim.AdamW's formulas)."""
    b1, b2, eps = 0.9, 0.999, 1e-8

    def loss(params: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = torch.func.functional_call(net, params, (b["input_ids"], b["attention_mask"]))
        return F.cross_entropy(
            logits[:, :-1].reshape(-1, VOCAB), b["labels"][:, 1:].reshape(-1), ignore_index=-100
        )

    def step(state: tuple[Any, ...], b: dict[str, torch.Tensor]) -> tuple[Any, ...]:
        params, m, v, t = state
        grads, value = torch.func.grad_and_value(loss)(params, b)
        t = t + 1
        bc1, bc2 = 1 - b1**t, 1 - b2**t
        new_p, new_m, new_v = {}, {}, {}
        for k, p in params.items():
            p = p * (1 - lr * wd)
            new_m[k] = m[k].lerp(grads[k], 1 - b1)
            new_v[k] = v[k] * b2 + (1 - b2) * grads[k] * grads[k]
            new_p[k] = p - (lr / bc1) * new_m[k] / ((new_v[k] / bc2).sqrt() + eps)
        return new_p, new_m, new_v, t, value

    params = {k: p.detach().clone() for k, p in net.named_parameters()}
    zeros = {k: torch.zeros_like(p) for k, p in params.items()}
    return step, (params, zeros, dict(zeros), torch.zeros((), dtype=torch.float64))


def counting(backend: str, nodes: list[int]) -> Any:
    """A backend that records each graph's FX node count, then compiles with ``backend``."""
    from torch._dynamo.backends.registry import lookup_backend

    inner = lookup_backend(backend)

    def compile_graph(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        nodes.append(len(gm.graph.nodes))
        return inner(gm, example_inputs)

    return compile_graph


def child(variant: str, layers: int, width: int, backend: str) -> dict[str, Any]:
    """Compile and run ``variant`` once in this process; what the first call cost."""
    from torch._dynamo.utils import compile_times, counters

    torch.set_num_threads(1)
    net, b, nodes = model(layers, width), batch(), []
    if variant == "hand":
        fn, state = hand_step(net)
        compiled = torch.compile(fn, fullgraph=True, backend=counting(backend, nodes))
        t0 = time.perf_counter()
        compiled(state, b)
    else:
        algorithms = [] if variant == "sbfunc plain" else [
            sbfunc.selective_backprop.TokenSelection(0.6, score="uniform")
        ]  # fmt: skip
        loss_fn = sbfunc.per_sample_loss(
            net, sbfunc.module.next_token_cross_entropy, input=("input_ids", "attention_mask"),
            target="labels",
        )  # fmt: skip
        step = sbfunc.make_train_step(loss_fn, sbfunc.optim.adamw(1e-3), algorithms)
        step.compile(backend=counting(backend, nodes), fullgraph=True)
        state = step.init(*sbfunc.split_module(net, clone=True), key=sbfunc.random.key(1),
                          total_steps=10**6)  # fmt: skip
        t0 = time.perf_counter()
        step(state, b)
    seconds = time.perf_counter() - t0
    phases = compile_times(repr="csv", aggregate=True)
    return {
        "seconds": seconds,
        "graphs": len(nodes),
        "nodes": nodes,
        "recompiles": sum(counters["recompiles"].values()),
        "phases": dict(zip(phases[0], phases[1], strict=False)),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="backend='aot_eager'")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    backend = "aot_eager" if args.quick else "inductor"
    if args.child is not None:
        print(json.dumps(child(args.child, args.layers, args.width, backend)))
        return
    print(f"torch {torch.__version__}, {backend}, CausalLM {args.layers} layers width "
          f"{args.width}, batch {BATCH}x{LENGTH}, 1 thread, fresh caches")  # fmt: skip
    results = {}
    for variant in VARIANTS:
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
            cmd = [sys.executable, __file__, "--child", variant, "--layers", str(args.layers),
                   "--width", str(args.width)] + (["--quick"] if args.quick else [])  # fmt: skip
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            results[variant] = json.loads(done.stdout.strip().splitlines()[-1])
    hand = results["hand"]["seconds"]
    for variant, r in results.items():
        phases = ", ".join(f"{k} {float(v):.1f} s" for k, v in r["phases"].items())
        print(f"{variant:<14} first call {r['seconds']:6.1f} s ({r['seconds'] / hand:.2f}x "
              f"hand); {r['graphs']} graph(s) of {r['nodes']} FX nodes, {r['recompiles']} "
              f"recompiles; {phases}")  # fmt: skip
    print("target: sbfunc plain within 2x hand")


if __name__ == "__main__":
    main()
