"""Several compiled steps in one process: does compiling more steps slow the first ones down?

torch.compile caches graphs per code object and checks a frame's cache entries' guards on
every call. Each :class:`sbfunc.step.TrainStep` has its own copy of its traced methods, so its
calls never check another step's entries. This script measures, on the time-to-accuracy
study's CNN (width 96, batch 256, compiled), a plain step, a Selective Backprop step
(rank-power, keep 0.5) and the scoring forward, interleaved; then compiles ``--extra`` more
steps in the same process (as the study does, one per method) and measures again. It prints
``T_full / T_sb`` both times and the dynamo cache-lookup time per SB step (from the profiler).
``--shared`` binds every step to the class's own methods (one shared code object, the
behaviour before each step had its own) to show the difference.

Run: ``python benchmarks/many_steps.py`` and ``python benchmarks/many_steps.py --shared``.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: see compiled_step.py

import argparse
import statistics
import sys
import types
from pathlib import Path
from typing import Any

import torch
import torch._dynamo
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import sbfunc
from sbfunc import policies as P

sys.path.insert(0, str(Path(__file__).resolve().parent))
import time_to_accuracy
from _timing import interleaved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extra", type=int, default=10, help="steps compiled in between")
    parser.add_argument("--shared", action="store_true", help="one code object for all steps")
    args = parser.parse_args()
    torch.set_num_threads(2)
    torch._dynamo.config.recompile_limit = 64
    torch.manual_seed(0)
    model = time_to_accuracy.make_model(96)
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, input=0, target=1, mode="train")
    init = sbfunc.split_module(model, clone=True)
    n = 256
    batch = (torch.randn(n, 1, 40), torch.randint(0, 10, (n,)), torch.arange(n))
    half = tuple(t[: n // 2] for t in batch)

    def compiled(policy: P.Policy | None) -> tuple[Any, Any]:
        sb = sbfunc.SelectiveBackprop(0.0, 1.0, interrupt=0, policy=policy, ids=2)
        algs = [] if policy is None else [sb]
        step = sbfunc.make_train_step(loss_fn, sbfunc.optim.adam(1e-3), algs)
        if args.shared:
            for name in ("forward", "core"):
                setattr(step, name, types.MethodType(getattr(sbfunc.step.TrainStep, name), step))
        state = step.init(*init, key=sbfunc.random.key(0), total_steps=64)
        return torch.compile(step), state._replace(time=state.time._replace(elapsed=0.5))

    (plain, s0), (sb, s1) = compiled(None), compiled(P.rank_power(0.5))
    states = {"full": s0, "kept": s0, "sb": s1}
    score = torch.compile(lambda p, b, x: sbfunc.score.score_losses(loss_fn, p, b, x))

    def full() -> None:
        states["full"] = plain(states["full"], batch)[0]

    def kept() -> None:
        states["kept"] = plain(states["kept"], half)[0]

    def sb_step() -> None:
        states["sb"] = sb(states["sb"], batch)[0]

    def scoring() -> None:
        score(*init, batch)

    def report(label: str) -> None:
        t = interleaved({"T_full": full, "T_kept": kept, "T_sb": sb_step, "T_score": scoring},
                        7, 4, warmup=3)  # fmt: skip
        med = {k: statistics.median(v) * 1e3 for k, v in t.items()}
        ratios = [f / s for f, s in zip(t["T_full"], t["T_sb"], strict=True)]
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(5):
                sb_step()
        lookup = sum(e.self_cpu_time_total for e in prof.key_averages()
                     if "Cache Lookup" in e.key) / 5e3  # fmt: skip
        ideal = med["T_full"] / (med["T_kept"] + med["T_score"])
        print(f"{label:34}" + "".join(f"{k} {v:6.1f} ms  " for k, v in med.items())
              + f"T_full/T_sb {med['T_full'] / med['T_sb']:.3f} "
              f"[{min(ratios):.2f}-{max(ratios):.2f}] (ideal {ideal:.3f}), "
              f"cache lookups {lookup:.2f} ms per SB step")  # fmt: skip

    print(f"torch {torch.__version__}, 2 threads, {'shared' if args.shared else 'own'} code")
    report("2 compiled steps")
    for i in range(args.extra):  # the study's other methods, each its own compiled step
        step, state = compiled(P.top_k(0.5 - 0.01 * i) if i % 2 else None)
        for _ in range(2):
            state = step(state, batch)[0]
    report(f"after {args.extra} more compiled steps")


if __name__ == "__main__":
    main()
