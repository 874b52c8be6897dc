"""Cheaper scoring: how well reduced-precision scores rank, and what each scoring option costs.

Part 1 (agreement, deterministic): a CNN is trained on MNIST-1D for a few epochs; at several
points of training the per-sample losses of a 1024-row batch are computed in float32 and under
``torch.autocast(..., dtype=torch.bfloat16)`` (``Scoring(dtype=...)`` of Selective Backprop),
and their agreement is reported as Spearman's rank correlation and as the overlap of the kept
halves (top 50% by loss, what ``top_k(keep=0.5)`` keeps) and of the rank-power selections
drawn with the same key.

Part 2 (cost, timed): ``T_score`` (one no-grad scoring forward of the batch), in float32,
bfloat16 and at ``scale_factor=0.5``, against ``T_full`` (one compiled training step on the
full batch), interleaved, medians with the spread; so the ideal SB speed-up
``T_full / (T_score + T_kept)`` of each option can be read off.

Run: ``python benchmarks/scoring.py`` (``--quick`` for a smoke run; ``--no-timing`` for part 1
only).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # a shared 2-core machine: see compiled_step

import argparse
import statistics
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from _timing import interleaved  # benchmarks/ is the script's folder
from torch import nn

import sbfunc


def make_model(width: int = 64) -> nn.Module:
    c = width
    return nn.Sequential(
        nn.Conv1d(1, c, 5, padding=2), nn.ReLU(),
        nn.Conv1d(c, c, 5, stride=2, padding=2), nn.ReLU(),
        nn.Conv1d(c, c, 5, stride=2, padding=2), nn.ReLU(),
        nn.AdaptiveAvgPool1d(10), nn.Flatten(), nn.Linear(c * 10, 10),
    )  # fmt: skip


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    ra = torch.argsort(torch.argsort(a)).double()
    rb = torch.argsort(torch.argsort(b)).double()
    return float(torch.corrcoef(torch.stack([ra, rb]))[0, 1])


def overlap(a: torch.Tensor, b: torch.Tensor) -> float:
    return len(set(a.tolist()) & set(b.tolist())) / a.shape[0]


def agreement(data: sbfunc.datasets.Split, epochs: int) -> None:
    torch.manual_seed(0)
    model = make_model()
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.adam(3e-3))
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))
    score_fn = loss_fn.with_mode("eval")
    batch = (data.x_test[:1024], data.y_test[:1024])
    key = sbfunc.random.key(1)
    print("part 1: bfloat16 vs float32 scores on 1024 held-out rows")
    print(
        f"{'epoch':>6}{'spearman':>10}{'top-50% overlap':>17}{'rank-power overlap':>20}"
        f"{'two f32 keys':>14}"
    )
    for epoch in range(epochs + 1):
        if epoch:
            batches = sbfunc.datasets.batches(
                data.x_train, data.y_train, 128, key=sbfunc.random.fold_in(key, epoch)
            )
            for b in batches:
                state = step(state, b[:2])[0]
        full = sbfunc.score.score_losses(score_fn, state.params, state.buffers, batch)
        low = sbfunc.score.score_losses(
            score_fn, state.params, state.buffers, batch, dtype=torch.bfloat16
        )
        half = full.shape[0] // 2  # 512, fewer with --quick's smaller test split
        top_full, top_low = torch.topk(full, half).indices, torch.topk(low, half).indices

        def rp(scores: torch.Tensor, k: Any) -> torch.Tensor:
            policy = sbfunc.policies.rank_power(0.5)
            return policy.select(scores, policy.init(), key=k)[0].indices

        rp_full, rp_low = rp(full, key), rp(low, key)
        rp_other = rp(full, sbfunc.random.fold_in(key, 1))
        print(
            f"{epoch:>6}{spearman(full, low):>10.4f}{overlap(top_full, top_low):>17.3f}"
            f"{overlap(rp_full, rp_low):>20.3f}{overlap(rp_full, rp_other):>14.3f}"
        )
    print(
        "rank-power gives each sorted position its own Gumbel noise, so any reordering (bf16"
        " ties) redraws:\ncompare its overlap with two independent float32 draws; the law is"
        " what matters there."
    )


def timing(data: sbfunc.datasets.Split, repeats: int, inner: int) -> None:
    torch.manual_seed(0)
    model = make_model()
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    score_fn = loss_fn.with_mode("eval")
    step = torch.compile(sbfunc.make_train_step(loss_fn, sbfunc.optim.adam(3e-3)))
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))
    full_batch = (data.x_train[:256], data.y_train[:256])
    kept_batch = (data.x_train[:128], data.y_train[:128])
    params, buffers = state.params, state.buffers

    def scorer(**kw: Any) -> Callable[[], torch.Tensor]:
        return lambda: sbfunc.score.score_losses(score_fn, params, buffers, full_batch, **kw)

    fns = {
        "T_full (compiled step, 256 rows)": lambda: step(state, full_batch),
        "T_kept (compiled step, 128 rows)": lambda: step(state, kept_batch),
        "T_score float32": scorer(),
        "T_score bfloat16": scorer(dtype=torch.bfloat16),
        "T_score scale_factor=0.5": scorer(scale_factor=0.5),
    }
    times = interleaved(fns, repeats, inner, warmup=5)
    ref = times["T_full (compiled step, 256 rows)"]
    threads = torch.get_num_threads()
    print(f"\npart 2: costs, medians of {repeats} interleaved repeats ({threads} threads)")
    for k, v in times.items():
        rel = [x / r for x, r in zip(v, ref, strict=True)]
        print(
            f"{k:34}{statistics.median(v) * 1e3:8.2f} ms  = {statistics.median(rel):.3f} T_full"
            f" [{min(rel):.3f}-{max(rel):.3f}]"
        )
    kept = statistics.median(times["T_kept (compiled step, 128 rows)"])
    full = statistics.median(ref)
    for k in ("T_score float32", "T_score bfloat16", "T_score scale_factor=0.5"):
        ideal = full / (statistics.median(times[k]) + kept)
        print(f"ideal SB speed-up (keep 0.5) with {k[8:]:18}: {ideal:.3f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-timing", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(2)
    data = sbfunc.datasets.mnist1d(2000 if args.quick else 8000)
    agreement(data, 1 if args.quick else 4)
    if not args.no_timing:
        timing(data, *((3, 3) if args.quick else (15, 10)))


if __name__ == "__main__":
    main()
