"""Host overhead of a language model's step (issue 41, item 2), on the CPU where anyone can
measure it: a tiny ``sbfunc.models.CausalLM`` whose arithmetic is negligible, one thread, so a
step's time is its Python and dispatch.

Timed side by side, interleaved (A B C A B C ..., one process, the same batch), medians of
per-round ratios with their interquartile range:

* ``torch loop``: what a user writes by hand: ``torch.optim.AdamW`` (``fused=True`` where the
  CPU build has it, else foreach) and Hugging Face's causal LM loss
  (``F.cross_entropy(logits[:, :-1], labels[:, 1:], ignore_index=-100)``);
* ``sbfunc plain``: ``make_train_step`` with ``next_token_cross_entropy`` and ``adamw``;
* ``sbfunc tokens``: the same with ``TokenSelection(0.6, score="uniform")``.

It also counts the aten operators one eager step dispatches (``TorchDispatchMode``) at two
depths: what token selection adds must not grow with the number of layers (1.1 detached every
tensor of the state: 146 added at 2 layers, 362 at 8).

Targets: ``sbfunc plain <= 1.10x torch loop``; ``sbfunc tokens <= 1.05x sbfunc plain``; token
selection's added operators equal at both depths.

Run: ``flock /tmp/sbfunc-timing.lock python benchmarks/lm_host.py`` (``--rounds``,
``--quick`` for a smoke run).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # a shared machine: see compiled_step.py

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import sbfunc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _lm_runs import lm_loss
from _steps import autocast, compiled_advance
from _timing import interleaved, paired, quartiles

LENGTH, BATCH, WIDTH, VOCAB = 32, 8, 32, 257
LR, KEEP = 1e-3, 0.6


def batch() -> dict[str, torch.Tensor]:
    ids = sbfunc.random.randint(sbfunc.random.key(7), (BATCH, LENGTH), 0, VOCAB)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def model(layers: int) -> sbfunc.models.CausalLM:
    return sbfunc.models.CausalLM(
        d_model=WIDTH, num_heads=2, num_layers=layers, max_len=LENGTH, key=sbfunc.random.key(0)
    )


def fused_adamw(params: Any) -> torch.optim.AdamW:
    """``torch.optim.AdamW``, fused where the build has the kernel for the parameters'
    device, else ``foreach``."""
    params = list(params)
    try:
        return torch.optim.AdamW(params, LR, fused=True)
    except RuntimeError:  # a build without the fused kernel
        return torch.optim.AdamW(params, LR, foreach=True)


def hf_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Hugging Face's causal LM loss: next-token cross-entropy, labels -100 ignored."""
    return F.cross_entropy(
        logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100
    )


def loop_step(
    net: torch.nn.Module, b: dict[str, torch.Tensor], *, precision: str = "fp32",
    backend: str | None = None,
) -> Callable[[], Any]:  # fmt: skip
    """The hand-written loop's step on ``b``: :func:`fused_adamw` and :func:`hf_loss`, the
    forward and loss under bf16 autocast for ``precision="amp_bf16"``; ``backend``: the
    forward and loss ``torch.compile``\\ d with it (nanoGPT's recipe), else eager."""
    opt = fused_adamw(net.parameters())
    device = b["input_ids"].device

    def forward_loss(ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        with autocast(device, precision):
            return hf_loss(net(ids, mask), labels)

    loss = forward_loss if backend is None else torch.compile(forward_loss, backend=backend)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss(b["input_ids"], b["attention_mask"], b["labels"]).backward()
        opt.step()

    return step


def torch_loop(layers: int) -> Callable[[], Any]:
    """The hand-written loop: torch.optim.AdamW and Hugging Face's loss."""
    return loop_step(model(layers), batch())


def train_step(
    net: torch.nn.Module, algorithms: list[Any], *, precision: str = "fp32"
) -> sbfunc.TrainStep:
    """sbfunc's step of ``net``: ``next_token_cross_entropy`` and ``adamw``."""
    extra = {} if precision == "fp32" else {"precision": precision}
    return sbfunc.make_train_step(lm_loss(net), sbfunc.optim.adamw(LR), algorithms, **extra)


def init_state(step: sbfunc.TrainStep, net: torch.nn.Module, key: sbfunc.random.Key) -> Any:
    return step.init(*sbfunc.split_module(net, clone=True), key=key, total_steps=10**9)


def sbfunc_step(layers: int, algorithms: list[Any]) -> Callable[[], Any]:
    """sbfunc's eager step on the same model and batch."""
    net, b = model(layers), batch()
    step = train_step(net, algorithms)
    advance = compiled_advance(step, init_state(step, net, sbfunc.random.key(1)), "eager", "")
    return lambda: advance(b)


def tokens() -> list[Any]:
    return [sbfunc.selective_backprop.TokenSelection(KEEP, score="uniform")]


def excess(reference: torch.nn.Module) -> list[Any]:
    """``TokenSelection`` by excess loss over ``reference`` (RHO-LOSS per token)."""
    S = sbfunc.selective_backprop
    ref = S.reference_model(lm_loss(reference), *sbfunc.split_module(reference))
    return [S.TokenSelection(KEEP, reference=ref, score="excess")]


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.count += 1
        return func(*args, **(kwargs or {}))


def operators(run: Callable[[], Any]) -> int:
    """The aten operators one warm call of ``run`` dispatches."""
    for _ in range(3):
        run()
    with _Ops() as ops:
        run()
    return ops.count


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--inner", type=int, default=20)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    rounds, inner = (3, 2) if args.quick else (args.rounds, args.inner)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, CausalLM width {WIDTH}, batch {BATCH}x{LENGTH}")
    for layers in (2, 8):
        plain, tok = operators(sbfunc_step(layers, [])), operators(sbfunc_step(layers, tokens()))
        loop = operators(torch_loop(layers))
        print(f"{layers} layers: aten operators per step: torch loop {loop}, sbfunc plain "
              f"{plain}, tokens {tok} (token selection adds {tok - plain})")  # fmt: skip
    rows = {"torch loop": torch_loop(2), "sbfunc plain": sbfunc_step(2, []),
            "sbfunc tokens": sbfunc_step(2, tokens())}  # fmt: skip
    times = interleaved(rows, rounds, inner)
    print(f"\n{'step':<14} {'us/step':>8}  ratio, median [IQR] of per-round ratios")
    for name, base in (("torch loop", None), ("sbfunc plain", "torch loop"),
                       ("sbfunc tokens", "sbfunc plain")):  # fmt: skip
        us = quartiles(times[name])[1] * 1e6
        cell = (
            ""
            if base is None
            else "{1:.3f} [{0:.3f}-{2:.3f}] of {3}".format(*paired(times[name], times[base]), base)
        )
        print(f"{name:<14} {us:8.0f}  {cell}")
    print("targets: sbfunc plain <= 1.10x torch loop; sbfunc tokens <= 1.05x sbfunc plain")


if __name__ == "__main__":
    main()
