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
    like: tuple[torch.Tensor, ...], keep: float, *,
    candidates: tuple[torch.Tensor, ...] | None = None, compile: bool = True,
    repeats: int = 7, inner: int = 4,
) -> dict[str, Any]:  # fmt: skip
    """Medians (ms) and [min, max] of ``T_full`` (a plain step on ``like``), ``T_kept`` (a
    plain step on the kept fraction of the SB steps' loader batch ``candidates``, default
    ``like``), ``T_score`` (the scoring forward of ``candidates``) and of the SB steps the study
    runs (inside their window, on ``candidates``), plus the ideal epoch ratio (see
    :func:`epoch_ratios`); ``compile=False`` scores eagerly (a smoke run)."""
    if "plain" not in trainers:  # one method per process (--methods rank_power): no regime
        return {"note": "no plain step in this process: the regime needs one"}
    candidates = like if candidates is None else candidates
    n = max(1, int(keep * candidates[0].shape[0]))
    kept = tuple(t[:n] for t in candidates)

    def score(p: dict, b: dict, batch: Any) -> torch.Tensor:
        return sbfunc.score.score_losses(loss_fn, p, b, batch)

    scorer = torch.compile(score) if compile else score
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
           "T_score": lambda: scorer(*init, candidates)}  # fmt: skip
    for m in ("rank_power", "rank_power_s0.5"):
        if m in trainers:
            fns[f"T_sb[{m}]"] = stepper(m, candidates, trainers[m])
    times = interleaved(fns, repeats, inner, warmup=3)
    out: dict[str, Any] = {k: [round(statistics.median(v) * 1e3, 1), round(min(v) * 1e3, 1),
                               round(max(v) * 1e3, 1)] for k, v in times.items()}  # fmt: skip
    return {**out, **epoch_ratios(times, like[0].shape[0] / candidates[0].shape[0])}


def epoch_ratios(times: dict[str, list[float]], r: float) -> dict[str, Any]:
    """The ideal ``T_full / (r (T_score + T_kept))`` and ``T_full / (r T_sb)`` per SB step from
    the medians of ``times``: plain's epoch time over SB's, ``r`` SB steps per plain step (1
    when both load the same batches, ``keep`` when SB loads ``1 / keep`` times the rows)."""
    med = {k: statistics.median(v) for k, v in times.items()}
    out: dict[str, Any] = {
        "ideal": round(med["T_full"] / (r * (med["T_score"] + med["T_kept"])), 3)
    }
    for k in med:
        if k.startswith("T_sb"):
            out[f"T_full/{k}"] = round(med["T_full"] / (r * med[k]), 3)
    out["note"] = "ms: median [min, max] over interleaved repeats"
    if r != 1:
        out["note"] += f"; per epoch: {r:.3g} SB steps (on the candidates) per plain step"
    return out
