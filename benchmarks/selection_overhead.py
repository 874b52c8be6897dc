"""Per-step cost of DivBS and Bayesian selection over uniform selection at the same kept count.

The papers report their rules' wall-time overhead over uniform selection at the same budget:
DivBS under 5% (13.9 vs 13.2 s per epoch, ResNet-18 on CIFAR), Bayesian selection about 50%
(21 vs 14 s per epoch, ResNet-18 on CIFAR-100, with a zero-shot CLIP reference). This script
times, interleaved in one process, the compiled Selective Backprop step of the time-to-accuracy
study's CNN (MNIST-1D rows, batch 256) with ``random_subset(b)`` (uniform), ``divbs(b)`` and
``bayesian(b)`` (its default 256 Monte-Carlo draws, and 32), at each budget ``b``, and prints
each rule's step time over the uniform step's: median [IQR] of the per-round ratios. The
uniform SB step itself is given against a plain step, so the overhead reads both as a share
of an SB step and of a full step.

``--model resnet18`` times the papers' model instead: the benchmarks' ResNet-18 (CIFAR's stem,
11.2M parameters, head input 512) on random 32x32 images, batch 256 (``--widths`` then sets
its base width; 64 is the papers'). ``--device cuda`` runs on a GPU, each timed block
bracketed by ``torch.cuda.synchronize``: the setting of the papers' figures.

Run: ``python benchmarks/selection_overhead.py`` (``--quick``: an eager smoke run;
``--widths 64 96``, ``--budgets 0.1 0.3``; on a GPU: ``--device cuda --model resnet18
--widths 64``).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: a shared machine

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import sbfunc
from sbfunc import policies as P

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _models import resnet18
from _timing import device_sync, interleaved, quartiles
from _tta_methods import head_features, sb
from time_to_accuracy import make_model

MODELS = ("cnn", "resnet18")


@dataclass(frozen=True)
class Sizes:
    train: int = 2048  # sample ids (the Bayesian reference table's length)
    width: int = 64
    keep: float = 0.1
    start: float = 0.0  # selection on from the first step
    batch: int = 256
    model: str = "cnn"  # the study's 1-D CNN on MNIST-1D, or "resnet18" on 32x32 images
    device: str = "cpu"


def features(cfg: Sizes) -> int:
    """The model's head input size (the Bayesian posterior's feature factor is its square)."""
    return head_features(cfg.width) if cfg.model == "cnn" else 8 * cfg.width


def rules(cfg: Sizes) -> dict[str, Callable[[], list[Any]]]:
    """The SB algorithms timed at ``cfg.keep`` (plain: none)."""
    f, k, n = features(cfg), cfg.keep, cfg.train

    def bayes(draws: int) -> list[Any]:
        ref = torch.zeros(n)
        return [
            sb(
                cfg,
                P.bayesian(k, num_features=f, num_classes=10, reference_losses=ref, draws=draws),
            )
        ]

    return {
        "plain": lambda: [],
        "uniform": lambda: [sb(cfg, P.random_subset(k))],
        "divbs": lambda: [sb(cfg, P.divbs(k))],
        "bayesian": lambda: bayes(256),
        "bayesian_s32": lambda: bayes(32),
    }


def stepper(
    cfg: Sizes, algorithms: list[Any], batch: tuple[torch.Tensor, ...], *, compiled: bool
) -> Callable[[], None]:
    """One training step of the study's CNN (``step.compile()``d when ``compiled``), called on
    ``batch`` over and over."""
    torch.manual_seed(0)
    model = make_model(cfg.width) if cfg.model == "cnn" else resnet18(width=cfg.width)
    model = model.to(cfg.device)
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.adam(1e-3), algorithms)
    if compiled:
        step.compile()
    box = [step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))]

    def run() -> None:
        box[0] = step(box[0], batch)[0]

    return run


def example_batch(cfg: Sizes) -> tuple[torch.Tensor, ...]:
    """``(x, y, ids)`` of ``cfg.batch`` rows on ``cfg.device``: MNIST-1D rows for the CNN,
    random 32x32 images and labels for the ResNet-18 (timing does not need real images)."""
    b = cfg.batch
    if cfg.model == "cnn":
        data = sbfunc.datasets.mnist1d(cfg.train + 500, seed=0)
        x, y = data.x_train[:b], data.y_train[:b]
    else:
        gen = torch.Generator().manual_seed(0)
        x, y = torch.randn(b, 3, 32, 32, generator=gen), torch.randint(0, 10, (b,), generator=gen)
    return tuple(t.to(cfg.device) for t in (x, y, torch.arange(b)))


def measure(cfg: Sizes, repeats: int, inner: int, *, compiled: bool) -> dict[str, list[float]]:
    batch = example_batch(cfg)
    fns = {}
    for name, make in rules(cfg).items():
        t0 = time.perf_counter()
        fns[name] = stepper(cfg, make(), batch, compiled=compiled)
        for _ in range(3):  # compile outside the timing
            fns[name]()
        print(f"  {name}: compiled and warmed up in {time.perf_counter() - t0:.0f} s", flush=True)
    return interleaved(fns, repeats, inner, warmup=2, sync=device_sync(cfg.device))


def ratio_cell(times: dict[str, list[float]], num: str, den: str) -> str:
    q1, med, q3 = quartiles([a / b for a, b in zip(times[num], times[den], strict=True)])
    return f"{med:.2f} [{q1:.2f}-{q3:.2f}]"


def report(cfg: Sizes, times: dict[str, list[float]]) -> None:
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    rows = max(1, int(cfg.keep * cfg.batch))
    print(f"\n{cfg.model} width {cfg.width} on {cfg.device}, batch {cfg.batch}, kept "
          f"{cfg.keep:.0%} ({rows} rows); ms per step, median")  # fmt: skip
    print("| rule | step (ms) | / uniform SB step | / plain step |\n|---|---|---|---|")
    for name in times:
        print(f"| {name} | {ms[name]:.1f} | {ratio_cell(times, name, 'uniform')} | "
              f"{ratio_cell(times, name, 'plain')} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="an eager smoke run")
    parser.add_argument("--widths", type=int, nargs="+", default=[64, 96])
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.1, 0.3])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", choices=MODELS, default="cnn")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda on a GPU")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: torch.cuda.is_available() is False here")
    torch.set_num_threads(args.threads)
    repeats, inner = (2, 1) if args.quick else (15, 5)
    widths, budgets = ([8], [0.25]) if args.quick else (args.widths, args.budgets)
    for width in widths:
        for keep in budgets:
            cfg = Sizes(width=width, keep=keep, batch=32 if args.quick else 256,
                        model=args.model, device=args.device)  # fmt: skip
            print(f"width {width}, keep {keep}: compiling", flush=True)
            report(cfg, measure(cfg, repeats, inner, compiled=not args.quick))


if __name__ == "__main__":
    main()
