"""Per-sample gradients and squared norms: sbfunc vs BackPACK vs naive, side by side.

Models (2 CPU threads, float32, seeded synthetic MNIST-shaped data):
* ``seed``: BackPACK's sub-sampling example, ``Flatten, Linear(784, 10)``, N=128, 4 samples;
* ``cnn``: two conv blocks and a linear head, N=256, half the samples kept.

Rows: per-sample gradients of the subset (``batch_grad(subsampling)`` vs BackPACK's
``BatchGrad(subsampling)`` vs ``vmap(grad)`` on all then slice vs an autograd loop over the
subset), and per-sample squared L2 norms on the full batch and on the subset
(``batch_l2_grad`` vs BackPACK's ``BatchL2Grad``, which cannot sub-sample, vs ``vmap(grad)``).
Each cell: median ms per call (interleaved rounds) and peak CPU memory allocated by torch
during one call (torch profiler, MiB). Ratios are ``other / sbfunc`` (> 1: sbfunc faster).
BackPACK columns are skipped when it is not installed
(``pip install --no-deps backpack-for-pytorch==1.7.1 unfoldNd einops``).

Run: ``python benchmarks/per_sample.py`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import os

# before torch: on a shared 2-core machine busy-waiting OpenMP threads stall (compiled_step.py)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import contextlib
import copy
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

import sbfunc
from sbfunc.per_sample import batch_grad, batch_l2_grad

try:
    import backpack
    from backpack import extensions as bp_ext
except ImportError:  # optional peer
    backpack = None


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 7 * 7, 10),
    )


def medians(fns: dict[str, Callable[[], object]], rounds: int, inner: int) -> dict[str, float]:
    """Median ms per call; the functions alternate within each round (noise hits all alike)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn()
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            times[name].append((time.perf_counter() - start) * 1e3 / inner)
    return {k: statistics.median(v) for k, v in times.items()}


@contextlib.contextmanager
def quiet_fds() -> Iterator[None]:
    """Silence the profiler's C-level start/stop lines (fds 1 and 2) while it runs."""
    sys.stdout.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 1)
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def peak_mib(fn: Callable[[], object]) -> float:
    """Peak of torch's net CPU allocations during one call, at op granularity (the profiler's
    per-op self allocations minus frees, accumulated in start-time order)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    with quiet_fds(), torch.profiler.profile(activities=activities, profile_memory=True) as prof:
        fn()
    current = peak = 0
    for e in sorted(prof.events(), key=lambda e: e.time_range.start):
        current += e.self_cpu_memory_usage
        peak = max(peak, current)
    return peak / 2**20


def contenders(model: nn.Module, x: torch.Tensor, y: torch.Tensor, sub: list[int]) -> dict:
    """{row: {method: thunk}} for one model."""
    model.eval()  # no dropout/BatchNorm here; spares per_sample_loss a mode switch per call
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    params, buffers = sbfunc.split_module(model)
    batch, idx = (x, y), torch.tensor(sub, device=x.device)
    ours_grad, ours_l2 = batch_grad(loss_fn), batch_l2_grad(loss_fn)

    def one(p: dict, xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, (p, buffers), (xi.unsqueeze(0),))
        return F.cross_entropy(out, yi.unsqueeze(0))

    vmapped = vmap(grad(one), in_dims=(None, 0, 0))

    def vmap_slice() -> dict:
        return {k: g[idx] for k, g in vmapped(params, x, y).items()}

    def loop() -> list:
        p = {k: v.detach().requires_grad_() for k, v in params.items()}
        return [torch.autograd.grad(one(p, x[i], y[i]), list(p.values())) for i in sub]

    def vmap_norms(rows: torch.Tensor | None) -> torch.Tensor:
        xs, ys = (x, y) if rows is None else (x[rows], y[rows])
        g = vmapped(params, xs, ys)
        return sum(v.flatten(1).square().sum(1) for v in g.values())

    rows = {
        "grads, subset": {
            "sbfunc": lambda: ours_grad(params, buffers, batch, subsampling=sub),
            "vmap+slice": vmap_slice,
            "loop": loop,
        },
        "l2, full batch": {
            "sbfunc": lambda: ours_l2(params, buffers, batch),
            "vmap": lambda: vmap_norms(None),
        },
        "l2, subset": {
            "sbfunc": lambda: ours_l2(params, buffers, batch, subsampling=sub),
            "vmap": lambda: vmap_norms(idx),
        },
    }
    if backpack is not None:
        bp_model = backpack.extend(copy.deepcopy(model))
        bp_loss = backpack.extend(nn.CrossEntropyLoss())

        def bp(*extensions: object) -> Callable[[], object]:
            def run() -> object:
                loss = bp_loss(bp_model(x), y)
                with backpack.backpack(*extensions):
                    loss.backward()
                return [p.grad for p in bp_model.parameters()]

            return run

        def bp_l2_subset() -> list:
            bp(bp_ext.BatchL2Grad())()
            return [p.batch_l2[idx] for p in bp_model.parameters()]

        rows["grads, subset"]["backpack"] = bp(bp_ext.BatchGrad(subsampling=sub))
        rows["l2, full batch"]["backpack"] = bp(bp_ext.BatchL2Grad())
        rows["l2, subset"]["backpack"] = bp_l2_subset
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few rounds (smoke run)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    setups = {
        "seed Linear(784,10) N=128, 4 kept": (
            nn.Sequential(nn.Flatten(), nn.Linear(784, 10)),
            128,
            [0, 1, 13, 42],
        ),
        "cnn N=256, 128 kept": (cnn(), 256, list(range(0, 256, 2))),
    }
    rounds = 3 if args.quick else 15
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"BackPACK {'absent' if backpack is None else 'present'}"
    )
    for title, (model, n, sub) in setups.items():
        x, y = torch.randn(n, 1, 28, 28), torch.randint(0, 10, (n,))
        inner = 20 if n == 128 else 2
        print(f"\n== {title}")
        for row, fns in contenders(model, x, y, sub).items():
            ms = medians(fns, rounds, 1 if args.quick else inner)
            mem = {k: peak_mib(fn) for k, fn in fns.items()}
            cells = "  ".join(
                f"{k} {ms[k]:7.2f} ms {mem[k]:6.1f} MiB"
                + ("" if k == "sbfunc" else f" (x{ms[k] / ms['sbfunc']:.2f})")
                for k in fns
            )
            print(f"{row:15s} {cells}")


if __name__ == "__main__":
    main()
