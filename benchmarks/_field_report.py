"""Tables, verdicts and CSV for ``benchmarks/selection_field.py``."""

from __future__ import annotations

import csv
import math
import platform
import statistics
from pathlib import Path
from typing import Any

import torch
from _tta_protocol import EQUAL_CANDIDATES
from _tta_protocol import NOTES as PROTOCOL_NOTES
from _tta_report import mean_std

Row = dict[str, Any]
LABELS = {"plain": "full", "random": "uniform", "infobatch_budget": "infobatch"}
CSV_FIELDS = (
    "method", "budget", "noise", "seed", "final_acc", "best_acc", "epochs_to_target", "wall_s",
    "wall_per_epoch_s", "bwd_share", "fwd_share", "mislabelled_share",
)  # fmt: skip


def label(method: str) -> str:
    return LABELS.get(method, method)


def dataset(noise: float) -> str:
    return "clean" if noise == 0 else f"{noise:.0%} label noise"


def _mean(values: list[float]) -> float:
    ok = [v for v in values if not math.isnan(v)]
    return statistics.mean(ok) if ok else math.nan


def _sd(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def pick(rows: list[Row], method: str, noise: float, budget: float | None = None) -> list[Row]:
    return [
        r for r in rows
        if r["method"] == method and r["noise"] == noise and budget in (None, r["budget"])
    ]  # fmt: skip


def targets(rows: list[Row], margin: float) -> dict[float, float]:
    """Per dataset: full training's mean final accuracy minus ``margin``."""
    noises = sorted({r["noise"] for r in rows})
    return {n: _mean([r["final_acc"] for r in pick(rows, "plain", n)]) - margin for n in noises}


def with_targets(rows: list[Row], margin: float) -> list[Row]:
    """New rows with ``epochs_to_target``: the first evaluation (in epochs) at or above the
    dataset's target, NaN when never reached (or without a full-training run)."""
    goal = targets(rows, margin)
    out = []
    for r in rows:
        t = goal.get(r["noise"], math.nan)
        hit = next((e for e, a in r["curve"] if a >= t), math.nan)
        out.append({**r, "epochs_to_target": hit})
    return out


def verdict(rows: list[Row], method: str, noise: float, budget: float) -> str:
    """``beats``/``ties``/``loses`` uniform at the same budget: the mean difference in final
    accuracy against the pooled standard deviation ``sqrt((sd_m^2 + sd_u^2) / 2)``."""
    m = [r["final_acc"] for r in pick(rows, method, noise, budget)]
    u = [r["final_acc"] for r in pick(rows, "random", noise, budget)]
    if not m or not u:
        return "no uniform run"
    diff, pooled = statistics.mean(m) - statistics.mean(u), math.hypot(_sd(m), _sd(u)) / 2**0.5
    word = "beats" if diff > pooled else "loses" if diff < -pooled else "ties"
    return f"{word} ({100 * diff:+.1f} pp, pooled sd {100 * pooled:.1f})"


def verdict_lines(rows: list[Row]) -> list[str]:
    methods = [m for m in dict.fromkeys(r["method"] for r in rows) if m not in ("plain", "random")]
    noises, budgets = sorted({r["noise"] for r in rows}), sorted({r["budget"] for r in rows})
    out = []
    for m in methods:
        parts = [
            f"{dataset(n)} b={b:g} {verdict(rows, m, n, b)}"
            for n in noises for b in budgets if pick(rows, m, n, b)
        ]  # fmt: skip
        out.append(f"- `{label(m)}` vs uniform: " + "; ".join(parts) + ".")
    return out


def table(rows: list[Row], noise: float) -> list[str]:
    """One dataset's table: full training, then every method per budget."""
    head = (
        "| method | budget | final acc % | epochs to target | reached | wall / epoch s "
        "| x full | backprop share % | mislabelled share of backprop % |"
    )
    lines = [head, "|" + "---|" * 9]
    full = _mean([r["wall_per_epoch_s"] for r in pick(rows, "plain", noise)])
    entries = dict.fromkeys((r["method"], r["budget"]) for r in rows if r["noise"] == noise)
    for m, b in sorted(entries, key=lambda e: (e[0] != "plain", e[1])):
        g = pick(rows, m, noise, b)
        reached = sum(not math.isnan(r["epochs_to_target"]) for r in g)
        ratio = _mean([r["wall_per_epoch_s"] for r in g]) / full
        cells = [
            label(m), "all" if m == "plain" else f"{b:g}",
            mean_std([r["final_acc"] for r in g], "{:.1f}", 100),
            mean_std([r["epochs_to_target"] for r in g], "{:.1f}"), f"{reached}/{len(g)}",
            mean_std([r["wall_per_epoch_s"] for r in g], "{:.2f}"), f"{ratio:.2f}",
            mean_std([r["bwd_share"] for r in g], "{:.0f}", 100),
            mean_std([r["mislabelled_share"] for r in g], "{:.1f}", 100),
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def render(rows: list[Row], *, notes: Row, config: Row, margin: float, total_s: float,
           command: str) -> str:  # fmt: skip
    """The markdown page: setup, one table per dataset, the verdicts against uniform."""
    rows = with_targets(rows, margin)
    protocol = notes.get("protocol", EQUAL_CANDIDATES)
    title = "" if protocol == EQUAL_CANDIDATES else ", equal backprop batch"
    text = [
        f"# The field's comparison table on MNIST-1D{title}",
        "",
        "Generated by `benchmarks/selection_field.py` (issue 28). Reproduce with:",
        "",
        f"    {command}",
        "",
        f"Machine: 2 CPU cores, torch {torch.__version__}, Python {platform.python_version()}; "
        f"the whole study took {total_s / 60:.1f} min (shared machine: wall times carry noise).",
        "",
        "## Setup",
        "",
        f"- {PROTOCOL_NOTES[protocol]}",
        f"- Config: `{config}`; loader batch per method and budget: "
        f"`{notes.get('loader_batch')}`.",
        *SETUP_NOTES,
        f"- Compile time per method and budget (s, excluded): `{notes['compile_s']}`; graphs "
        f"compiled during the timed runs: {notes.get('graphs_in_runs', 'not counted')}.",
        f"- Irreducible-loss models: `{notes['il']}`.",
    ]
    for noise, goal in targets(rows, margin).items():
        text += [
            "",
            f"## {dataset(noise).capitalize()} (mean ± std over seeds)",
            "",
            f"Target: full training's mean final accuracy minus {100 * margin:g} pp = "
            f"**{100 * goal:.1f}%**.",
            "",
            *table(rows, noise),
        ]
    text += ["", "## Against uniform at the same k", "", *VERDICT_NOTE, "", *verdict_lines(rows)]
    return "\n".join(text) + "\n"


def write_csv(path: Path, rows: list[Row], margin: float = 0.02) -> None:
    """One line per run (the curve left out)."""
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in with_targets(rows, margin):
            w.writerow({k: (f"{v:.5g}" if isinstance(v, float) else v) for k, v in r.items()})


VERDICT_NOTE = [
    "Final test accuracy against `uniform` (`random_subset(b)`) at the same budget and "
    "dataset: **beats** when the mean difference exceeds the pooled standard deviation "
    "`sqrt((sd^2 + sd_uniform^2) / 2)` over seeds, **loses** below minus it, **ties** "
    "otherwise."
]
SETUP_NOTES = [
    "- One protocol for every method (above): the same initial weights per seed, the same "
    "epochs, Adam with a cosine learning rate decayed to zero over the run; one "
    "`torch.compile`d step per method and budget shared by every seed and dataset, warmed up "
    "before timing (eager steps under `--smoke`).",
    "- Selection from the first step (`SelectiveBackprop(0.0, 1.0, interrupt=0, ids=2)`, no "
    "plain warm-up): each loaded batch is scored and `b` of it kept. `grad_norm` keeps the "
    "distinct rows of `k` draws with replacement (fewer than `k`); `infobatch` keeps every row "
    "whose id has no recorded loss yet (the whole first epoch) and `1 - r` of the well-learned "
    "ones: "
    "the backprop share column says how close each method gets to `b`.",
    "- Methods: `uniform` = `random_subset(b)`; `top_k(b)` (train loss); `rank_power(b)`; "
    "`grad_norm` = `grad_norm_importance(b)` scored by the logit-gradient norm "
    "`||softmax(z) - onehot(y)||`; `loshchilov(100, b, max_age=2)`; `rho_loss(b, irreducible)`; "
    "`infobatch(r, delta=1)` with `r = min(0.99, (1 - b) / 0.7)` (expected kept share `b` "
    "when 70% of the rows are below the mean recorded loss); `divbs(b)`; "
    "`bayesian(b, reference_losses=irreducible)`. Irreducible losses: the same CNN trained on a "
    "holdout as large as the training set with the same label noise, scored in eval mode.",
    "- Epochs to target: the first evaluation (`evals_per_epoch` an epoch) at or above the "
    "target, "
    "mean over the seeds that reached it ('reached'). Wall time per epoch: training only "
    "(evaluation excluded); 'x full' is its ratio to full training's on the same dataset.",
]
