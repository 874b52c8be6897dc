"""The regime of the time-to-accuracy study: what a plain step, its kept part and the scoring
forward cost, measured interleaved in one loop with the study's compiled steps."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: see compiled_step.py

import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import sbfunc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import interleaved


def measure_regime(
    loss_fn: sbfunc.module.ModuleLoss, trainers: dict[str, Any], init: tuple[dict, dict],
    like: tuple[torch.Tensor, ...], keep: float, *, repeats: int = 7, inner: int = 4,
) -> dict[str, Any]:  # fmt: skip
    """Medians (ms) and [min, max] of ``T_full``, ``T_kept``, ``T_score`` and of the SB steps
    the study runs (inside their window), plus the ideal ``T_full / (T_score + T_kept)``."""
    if "plain" not in trainers:  # one method per process (--methods rank_power): no regime
        return {"note": "no plain step in this process: the regime needs one"}
    n = max(1, int(keep * like[0].shape[0]))
    kept = tuple(t[:n] for t in like)
    score = torch.compile(lambda p, b, batch: sbfunc.score.score_losses(loss_fn, p, b, batch))
    plain = trainers["plain"]
    states = {}

    def stepper(name: str, batch: Any, trainer: Any) -> Callable[[], None]:
        # mid-run of a long run: elapsed stays at 0.5 (the step advances it from step and
        # total_steps), inside every SB window, however many steps the regime takes
        s = trainer.step.init(*init, key=sbfunc.random.key(0), total_steps=2**20)
        states[name] = s._replace(time=s.time._replace(step=2**19, elapsed=0.5))

        def run() -> None:
            states[name] = trainer.compiled(states[name], batch)[0]

        return run

    fns = {"T_full": stepper("T_full", like, plain), "T_kept": stepper("T_kept", kept, plain),
           "T_score": lambda: score(*init, like)}  # fmt: skip
    for m in ("rank_power", "rank_power_s0.5"):
        if m in trainers:
            fns[f"T_sb[{m}]"] = stepper(m, like, trainers[m])
    times = interleaved(fns, repeats, inner, warmup=3)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    out: dict[str, Any] = {k: [round(med[k], 1), round(min(v) * 1e3, 1), round(max(v) * 1e3, 1)]
                           for k, v in times.items()}  # fmt: skip
    out["ideal"] = round(med["T_full"] / (med["T_score"] + med["T_kept"]), 3)
    for k in med:
        if k.startswith("T_sb"):
            out[f"T_full/{k}"] = round(med["T_full"] / med[k], 3)
    out["note"] = "ms: median [min, max] over interleaved repeats"
    return out
