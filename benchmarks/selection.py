"""Selection overhead and Selective Backprop step speed, measured side by side.

(a) Selection overhead (rank + sample + gather, no forward) of ``policies.rank_power`` + ``take``
    against Composer's numpy path (argsort, weights on the host, ``np.random.choice`` without
    replacement, gather), at N = 256, 1024, 8192; and as a share of a full CNN train step at 256.
(b) One SB step (no-grad scoring forward + selection + train step on the kept rows) against
    one full train step for a small CNN at N=256, keep=0.5, scale_factor 1 and 0.5, next to
    the ideal ratio ``T_full / (T_score + keep * T_full)`` measured in the same run.

Run: ``python benchmarks/selection.py`` (add ``--quick`` for a smoke run).
"""

from __future__ import annotations

import os

# before torch: on a shared 2-core machine busy-waiting OpenMP threads stall (compiled_step.py)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from _timing import interleaved  # benchmarks/ is the script's folder
from torch import nn

import sbfunc
from sbfunc import random as sbrandom


def timeit(fn: Callable[[], object], repeats: int, inner: int = 1) -> float:
    """Median seconds per call over ``repeats`` rounds of ``inner`` calls (after a warm-up)."""
    fn()
    rounds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        rounds.append((time.perf_counter() - t0) / inner)
    return statistics.median(rounds)


def interleaved_medians(fns: dict[str, Callable[[], object]], repeats: int, inner: int) -> dict:
    """Median seconds per call of each function, timed round-robin (``_timing.interleaved``)."""
    times = interleaved(fns, repeats, inner, warmup=1)
    return {k: statistics.median(v) for k, v in times.items()}


def composer_indices(losses: torch.Tensor, keep: float) -> torch.Tensor:
    """Composer 0.32.1's selection after the forward: host weights and numpy choice."""
    n = losses.shape[0]
    sorted_idx = torch.argsort(losses)
    k = int(keep * n)
    weights = np.zeros(n)
    weights[sorted_idx.cpu().numpy()] = ((np.arange(n) + 0.5) / n) ** (1 / keep - 1)
    idx = np.random.choice(n, k, replace=False, p=weights / weights.sum())
    return torch.from_numpy(idx).to(losses.device)


def composer_select(x: torch.Tensor, y: torch.Tensor, losses: torch.Tensor, keep: float):
    idx = composer_indices(losses, keep)
    return x[idx], y[idx]


def sbfunc_indices(losses: torch.Tensor, keep: float, key) -> torch.Tensor:
    policy = sbfunc.policies.rank_power(keep)
    return policy.select(losses, policy.init(), key=key)[0].indices


def sbfunc_select(x: torch.Tensor, y: torch.Tensor, losses: torch.Tensor, keep: float, key):
    return sbfunc.batch.take((x, y), sbfunc_indices(losses, keep, key))


def synced(fn: Callable[[], object], device: torch.device) -> Callable[[], object]:
    """Wrap ``fn`` so a timing includes the device work it queued."""
    if device.type != "cuda":
        return fn

    def run() -> object:
        out = fn()
        torch.cuda.synchronize(device)
        return out

    return run


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, padding=1, stride=2),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(64, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few repeats (smoke run)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args()
    dev = torch.device(args.device)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    np.random.seed(0)
    reps = 5 if args.quick else 21

    # (b) first builds the model, so (a) can quote overhead relative to a full step.
    model = SmallCNN().to(dev)
    params, buffers = sbfunc.split_module(model, clone=True)
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    n, keep = 256, 0.5
    x = torch.randn(n, 3, 32, 32, device=dev)
    y = torch.randint(0, 10, (n,), device=dev)
    grad_fn = torch.func.grad(lambda p, b: loss_fn(p, buffers, b).mean())

    def train_step(batch):
        grads = grad_fn(params, batch)
        return {k: params[k] - 0.01 * grads[k] for k in params}

    def score(scale):
        return sbfunc.score.score_losses(loss_fn, params, buffers, (x, y), scale_factor=scale)

    key = sbrandom.key(0)

    def sb_step(scale):
        losses = score(scale)
        return train_step(sbfunc_select(x, y, losses, keep, key))

    t = interleaved_medians(
        {
            name: synced(fn, dev)
            for name, fn in {
                "full": lambda: train_step((x, y)),
                "score@1": lambda: score(1.0),
                "score@0.5": lambda: score(0.5),
                "sb@1": lambda: sb_step(1.0),
                "sb@0.5": lambda: sb_step(0.5),
            }.items()
        },
        repeats=reps,
        inner=1,
    )

    print(f"device: {dev}")
    print("(a) selection overhead, no forward: indices only, and indices + gather of the batch")
    print(f"{'N':>6} {'what':>15} {'composer/numpy':>15} {'sbfunc':>10} {'speedup':>8}")
    for size in (256, 1024, 8192):
        xs = torch.randn(size, 3, 32, 32, device=dev)
        ys = torch.randint(0, 10, (size,), device=dev)
        losses = torch.rand(size, device=dev)
        fns = {
            "composer idx": lambda losses=losses: composer_indices(losses, keep),
            "sbfunc idx": lambda losses=losses: sbfunc_indices(losses, keep, key),
            "composer+gather": lambda xs=xs, ys=ys, losses=losses: composer_select(
                xs, ys, losses, keep
            ),
            "sbfunc+gather": lambda xs=xs, ys=ys, losses=losses: sbfunc_select(
                xs, ys, losses, keep, key
            ),
        }
        r = interleaved_medians({k: synced(f, dev) for k, f in fns.items()}, repeats=reps, inner=5)
        for what, a, b in (
            ("indices", "composer idx", "sbfunc idx"),
            ("+ gather", "composer+gather", "sbfunc+gather"),
        ):
            print(
                f"{size:>6} {what:>15} {r[a] * 1e3:>12.3f} ms {r[b] * 1e3:>7.3f} ms "
                f"{r[a] / r[b]:>7.2f}x"
            )
        if size == 256:
            share = r["sbfunc+gather"] / t["full"]
            print(f"{'':>6} sbfunc selection + gather at N=256 = {share:.2%} of one full step")

    print("\n(b) one SB step vs one full step, small CNN, N=256, keep=0.5")
    print(f"{'scale':>6} {'T_full/T_sb':>12} {'ideal':>8} {'achieved/ideal':>15}")
    for scale in (1.0, 0.5):
        speedup = t["full"] / t[f"sb@{scale:g}"]
        ideal = t["full"] / (t[f"score@{scale:g}"] + keep * t["full"])
        print(f"{scale:>6} {speedup:>11.3f}x {ideal:>7.3f}x {speedup / ideal:>14.3f}")
    print(
        f"\nper-call medians: full step {t['full'] * 1e3:.1f} ms, scoring forward "
        f"{t['score@1'] * 1e3:.1f} ms (scale 1) / {t['score@0.5'] * 1e3:.1f} ms (scale 0.5)"
    )


if __name__ == "__main__":
    main()
