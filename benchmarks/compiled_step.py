"""The functional tax: sbfunc's pure step, eager and compiled, against a plain PyTorch loop.

For each model it times, interleaved (A B C A B C ..., medians over repeats, same batch, same
machine, one process):

* ``loop``: the plain PyTorch loop a user would otherwise write,
  ``opt.zero_grad(); F.cross_entropy(model(x), y).backward(); opt.step()`` with
  ``torch.optim.Adam`` (its default implementation on this device);
* ``eager``: ``sbfunc.make_train_step(loss_fn, sbfunc.optim.adam(lr))`` called eagerly;
* ``compiled``: ``torch.compile`` of that step (the first call, which compiles, is timed apart).

and prints ``eager / loop`` (target <= 1.05) and ``loop / compiled`` (target >= 1.15 on the two
CNNs), with the spread (min-max of the per-repeat ratios). Models: a tiny MLP (64 -> 128 -> 10)
at batch 64, the quickstart's 1-D CNN at its batch and the time-to-accuracy study's 1-D CNN
at batch 256 (both imported from their scripts), on MNIST-1D-shaped inputs ``[N, 1, 40]``.

Run: ``python benchmarks/compiled_step.py`` (``--quick`` for a smoke run; ``--threads 1
--models "tiny MLP, b64"`` shows the tiny MLP without OpenMP's thread wake-ups).
"""

from __future__ import annotations

import os

# The machine is shared: with busy-waiting OpenMP threads, a 2-thread team stalls whenever
# another process holds one of the 2 cores (10x outliers); passive waiting degrades gracefully.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import sbfunc

_ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(_ROOT / "benchmarks"), str(_ROOT / "examples")]
import quickstart  # noqa: E402  (the models the issue's targets name)
import time_to_accuracy  # noqa: E402
from _timing import interleaved  # noqa: E402


def tiny_mlp() -> tuple[nn.Module, tuple[int, ...], int]:
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)), (64,), 64


def quickstart_cnn() -> tuple[nn.Module, tuple[int, ...], int]:
    return quickstart.make_model(), (1, 40), quickstart.BATCH


def study_cnn() -> tuple[nn.Module, tuple[int, ...], int]:
    return time_to_accuracy.make_model(time_to_accuracy.FULL.width), (1, 40), 256


MODELS = {"tiny MLP, b64": tiny_mlp, f"quickstart CNN, b{quickstart.BATCH}": quickstart_cnn,
          "study CNN, b256": study_cnn}  # fmt: skip
LR = 1e-3


def runners(build: Callable[[], tuple[nn.Module, tuple[int, ...], int]]) -> tuple[dict, float]:
    """The three step functions (each advancing its own training) and the compile time."""
    torch.manual_seed(0)
    model, shape, batch = build()
    x, y = torch.randn(batch, *shape), torch.randint(0, 10, (batch,))

    loop_model = build()[0]
    loop_model.load_state_dict(model.state_dict())
    opt = torch.optim.Adam(loop_model.parameters(), LR)

    def loop() -> None:
        opt.zero_grad()
        F.cross_entropy(loop_model(x), y).backward()
        opt.step()

    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.adam(LR))
    compiled_step = torch.compile(step)
    params, buffers = sbfunc.split_module(model, clone=True)
    states = {
        "eager": step.init(params, buffers, key=sbfunc.random.key(0)),
        "compiled": step.init(params, buffers, key=sbfunc.random.key(0)),
    }

    def eager() -> None:
        states["eager"] = step(states["eager"], (x, y))[0]

    def compiled() -> None:
        states["compiled"] = compiled_step(states["compiled"], (x, y))[0]

    t0 = time.perf_counter()
    compiled()  # compiles
    first = time.perf_counter() - t0
    return {"loop": loop, "eager": eager, "compiled": compiled}, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few repeats (smoke run)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=sorted(MODELS))
    args = parser.parse_args()
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    repeats, inner = (3, 5) if args.quick else (15, 30)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {repeats} repeats")
    header = (
        f"{'model':22}{'loop ms':>9}{'eager ms':>10}{'compiled ms':>13}"
        f"{'eager/loop':>22}{'loop/compiled':>24}{'compile s':>11}"
    )
    print(header)
    print("-" * len(header))
    for name, build in MODELS.items():
        if name not in args.models:
            continue
        fns, first = runners(build)
        t = interleaved(fns, repeats, inner)
        med = {k: statistics.median(v) for k, v in t.items()}
        tax = [e / lo for e, lo in zip(t["eager"], t["loop"], strict=True)]
        gain = [lo / c for lo, c in zip(t["loop"], t["compiled"], strict=True)]
        print(
            f"{name:22}{med['loop'] * 1e3:9.2f}{med['eager'] * 1e3:10.2f}"
            f"{med['compiled'] * 1e3:13.2f}"
            f"{med['eager'] / med['loop']:8.3f} [{min(tax):.2f}-{max(tax):.2f}]"
            f"{med['loop'] / med['compiled']:10.3f} [{min(gain):.2f}-{max(gain):.2f}]"
            f"{first - med['compiled']:11.1f}"
        )
    print(
        "\neager/loop: the functional tax (target <= 1.05); loop/compiled: the compiled speed-up"
        " (target >= 1.15 on the CNNs). Ratios of medians, [min-max] of per-repeat ratios;"
        " compile s: the first compiled call minus a steady one."
    )


if __name__ == "__main__":
    main()
