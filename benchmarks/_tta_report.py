"""Tables, CSV, plot and target verdicts for ``benchmarks/time_to_accuracy.py``."""

from __future__ import annotations

import csv
import math
import platform
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from _tta_protocol import EQUAL_CANDIDATES
from _tta_protocol import NOTES as PROTOCOL_NOTES

Row = dict[str, Any]
CSV_FIELDS = (
    "method", "noise", "seed", "wall_s", "cpu_s", "forward_samples", "backprop_samples",
    "final_acc", "best_acc", "time_to_target_s", "target_ratio", "cpu_target_ratio",
    "mislabelled_share",
)  # fmt: skip
LOSS_BASED = ("rank_power", "top_k", "jiang_var")


def _ok(values: Sequence[float]) -> list[float]:
    return [v for v in values if not math.isnan(v)]


def mean_std(values: Sequence[float], fmt: str = "{:.3f}", scale: float = 1.0) -> str:
    """``mean ± std`` over the non-NaN values (``—`` when there are none)."""
    vals = [v * scale for v in _ok(values)]
    if not vals:
        return "—"
    sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return f"{fmt.format(statistics.mean(vals))} ± {fmt.format(sd)}"


def group(runs: list[Row], method: str, noise: float) -> list[Row]:
    return [r for r in runs if r["method"] == method and r["noise"] == noise]


def mean_of(runs: list[Row], method: str, noise: float, key: str) -> float:
    vals = _ok([r[key] for r in group(runs, method, noise)])
    return statistics.mean(vals) if vals else math.nan


def aggregate_table(runs: list[Row], methods: list[str], noises: list[float]) -> list[str]:
    head = (
        "| method | noise | wall s | wall / plain | cpu / plain | fwd samples | bwd samples "
        "| final acc % | best acc % | to plain's final, wall (x plain) | to plain's final, "
        "cpu (x plain) | reached | mislabelled share of bwd % |"
    )
    lines = [head, "|" + "---|" * 13]
    for noise in noises:
        plain_wall = mean_of(runs, "plain", noise, "wall_s")
        plain_cpu = mean_of(runs, "plain", noise, "cpu_s")
        for m in methods:
            g = group(runs, m, noise)
            if not g:
                continue
            reached = sum(not math.isnan(r["target_ratio"]) for r in g)
            cells = [
                m, f"{noise:.0%}", mean_std([r["wall_s"] for r in g], "{:.1f}"),
                f"{mean_of(runs, m, noise, 'wall_s') / plain_wall:.2f}",
                f"{mean_of(runs, m, noise, 'cpu_s') / plain_cpu:.2f}",
                mean_std([r["forward_samples"] for r in g], "{:.0f}", 1e-3) + "k",
                mean_std([r["backprop_samples"] for r in g], "{:.0f}", 1e-3) + "k",
                mean_std([r["final_acc"] for r in g], "{:.1f}", 100),
                mean_std([r["best_acc"] for r in g], "{:.1f}", 100),
                mean_std([r["target_ratio"] for r in g], "{:.2f}"),
                mean_std([r["cpu_target_ratio"] for r in g], "{:.2f}"), f"{reached}/{len(g)}",
                mean_std([r["mislabelled_share"] for r in g], "{:.1f}", 100),
            ]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def _speed_verdict(runs: list[Row], sb: list[str], bound: float = 0.8) -> str:
    """A time-to-accuracy target (``bound`` x plain's wall time) on the mean over seeds and on
    the slowest seed, in wall and in CPU time."""
    stats = {}
    for m in sb:
        g = group(runs, m, 0.0)
        wall, cpu = [r["target_ratio"] for r in g], [r["cpu_target_ratio"] for r in g]
        if g and not any(math.isnan(x) for x in wall + cpu):  # reached in every seed
            stats[m] = (statistics.mean(wall), max(wall), statistics.mean(cpu), max(cpu))
    if not stats:
        return "MISSED**: no SB policy reached the plain run's final accuracy in every seed."
    by_mean = min(stats, key=lambda m: stats[m][0])
    by_worst = min(stats, key=lambda m: stats[m][1])
    mean_ok, worst_ok = stats[by_mean][0] <= bound, stats[by_worst][1] <= bound
    verdict = "MET" if worst_ok else ("MET on the mean only" if mean_ok else "MISSED")

    def desc(m: str) -> str:
        w, ww, c, cw = stats[m]
        return f"`{m}` {w:.2f}x mean / {ww:.2f}x slowest seed (CPU time {c:.2f}x / {cw:.2f}x)"

    return (
        f"{verdict}** (wall time, seeds that all reached it): best mean {desc(by_mean)}; best "
        f"slowest seed {desc(by_worst)}. Other policies reaching it in every seed: "
        + ", ".join(desc(m) for m in stats if m not in (by_mean, by_worst))
        + "."
    )


def chunk_walls(run: Row) -> list[float]:
    """A run's training wall time per chunk (between two evaluations)."""
    walls = [point[0] for point in run["curve"]]
    return [b - a for a, b in zip([0.0, *walls[:-1]], walls, strict=True)]


def in_run_ratio(run: Row, plain: Row, stops: list[int], start: float) -> float:
    """``run``'s step ratio to ``plain`` inside SB's window, measured inside the runs: the
    median over the chunks that lie wholly in the window of the paired chunk ratio (the two
    runs advanced interleaved, so chunk ``i`` of each ran side by side)."""
    first = start * stops[-1]
    inside = [i for i, a in enumerate([0, *stops[:-1]]) if a >= first]
    mine, theirs = chunk_walls(run), chunk_walls(plain)
    return statistics.median(mine[i] / theirs[i] for i in inside)


def _prediction_verdict(runs: list[Row], regime: Row, start: float, method: str,
                        stops: list[int]) -> str:  # fmt: skip
    """Issue 28's whole-run target: ``method``'s whole runs against what its steps predict,
    SB on for ``1 - start`` of the steps: the step ratio measured inside the runs (the
    target), and the regime loop's ``T_sb / T_full`` (single steps replayed before the runs)."""
    plain = {(r["seed"], r["noise"]): r for r in runs if r["method"] == "plain"}
    pairs = [(r, plain[(r["seed"], r["noise"])]) for r in runs
             if r["method"] == method and (r["seed"], r["noise"]) in plain]  # fmt: skip
    if not pairs or len(stops) != len(pairs[0][0]["curve"]):
        return f"not measured (needs plain and `{method}` runs with one point per chunk)"
    actual = [r["wall_s"] / p["wall_s"] for r, p in pairs]
    predicted = [start + (1 - start) * in_run_ratio(r, p, stops, start) for r, p in pairs]
    gaps = [a / b - 1 for a, b in zip(actual, predicted, strict=True)]
    ok, mean = max(abs(g) for g in gaps) <= 0.05, statistics.mean(actual)
    step = regime.get(f"T_sb[{method}]")
    loop = (
        f"; the regime loop's single steps ({step[0]} vs {regime['T_full'][0]} ms) predict "
        f"{start + (1 - start) * step[0] / regime['T_full'][0]:.2f}x"
        if step is not None
        else ""
    )
    return (
        f"{'MET' if ok else 'MISSED'}**: `{method}` whole runs take {mean:.2f}x "
        f"plain's wall time (range {min(actual):.2f}-{max(actual):.2f}, {len(actual)} runs) "
        f"against {statistics.mean(predicted):.2f}x predicted from its steps inside the runs "
        f"(the median paired ratio of the half-epoch chunks wholly inside SB's window, SB on for "
        f"{1 - start:.0%} of the steps): {min(gaps):+.1%} to {max(gaps):+.1%} per run{loop}"
    )


def verdicts(runs: list[Row], methods: list[str], noises: list[float], regime: Row | None = None,
             start: float = 0.0, stops: list[int] | None = None, *,
             protocol: str = EQUAL_CANDIDATES) -> list[str]:  # fmt: skip
    """The issues' targets, stated as met or missed with the numbers behind them (the whole-run
    prediction (d) needs ``stops``, the chunks every run shares: not under equal-backprop)."""
    out = []
    sb = [m for m in methods if m != "plain"]
    if 0.0 in noises:
        issue = "issue 28" if protocol == EQUAL_CANDIDATES else "issue 37, equal backprop batch"
        out.append(
            "- **(a) some SB policy reaches plain's final accuracy in <= 0.8x its wall time at "
            f"0% noise: {_speed_verdict(runs, sb)}"
        )
        out.append(
            f"- **(c) {issue}: some rule reaches plain's final accuracy in <= 0.6x its wall "
            f"time at 0% noise, on every seed: {_speed_verdict(runs, sb, 0.6)}"
        )
    timed = ("rank_power", "loshchilov", "loshchilov_noage") if regime and stops else ()
    for method in (m for m in timed if m in methods):
        out.append(
            "- **(d) issue 28: a whole SB run within 5% of what its step ratio predicts: "
            + _prediction_verdict(runs, regime, start, method, stops)
        )
    if protocol != EQUAL_CANDIDATES:
        out.append(
            "- (d) issue 28's whole-run prediction: not measured here (the methods load "
            "batches of different sizes, so their half-epoch chunks do not pair step for step)."
        )
    noisy = [n for n in noises if n > 0]
    if noisy and "rho_loss" in methods:
        n = max(noisy)
        rho_mis, rho_acc = (
            mean_of(runs, "rho_loss", n, k) for k in ("mislabelled_share", "final_acc")
        )
        parts, met = [], True
        for m in (x for x in LOSS_BASED if x in methods):
            mis, acc = (mean_of(runs, m, n, k) for k in ("mislabelled_share", "final_acc"))
            met &= rho_mis < mis and rho_acc > acc
            parts.append(f"`{m}` {mis:.1%} mislabelled, {acc:.1%} final")
        out.append(
            f"- **(b) at {n:.0%} noise RHO-LOSS backprops a smaller share of mislabelled samples "
            f"than loss-based SB and ends with higher accuracy: {'MET' if met else 'MISSED'}**: "
            f"`rho_loss` {rho_mis:.1%} mislabelled, {rho_acc:.1%} final accuracy (means over "
            f"seeds) vs " + "; ".join(parts) + "."
        )
    return out


def write_csv(path: Path, runs: list[Row]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in runs:
            w.writerow({k: (f"{v:.5g}" if isinstance(v, float) else v) for k, v in r.items()})


def write_plot(path: Path, runs: list[Row], methods: list[str], noises: list[float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(noises), figsize=(6.5 * len(noises), 9), squeeze=False)
    colors = plt.get_cmap("tab20").colors
    for j, noise in enumerate(noises):
        for i, m in enumerate(methods):
            g = group(runs, m, noise)
            if not g:
                continue
            n = min(len(r["curve"]) for r in g)
            cols = [[r["curve"][t] for r in g] for t in range(n)]
            # mean over seeds at each evaluation point (same loader batch in every seed)
            wall = [statistics.mean(c[0] for c in pt) for pt in cols]
            bwd = [statistics.mean(c[3] for c in pt) for pt in cols]
            acc = [100 * statistics.mean(c[4] for c in pt) for pt in cols]
            style = (
                {"color": "black", "lw": 2.2} if m == "plain" else {"color": colors[i * 2 % 20]}
            )
            axes[0][j].plot(wall, acc, label=m, **style)
            axes[1][j].plot(bwd, acc, label=m, **style)
        target = 100 * mean_of(runs, "plain", noise, "final_acc")
        for row, xlabel in ((0, "wall time, s (training only)"), (1, "backpropagated samples")):
            ax = axes[row][j]
            ax.axhline(target, color="gray", ls="--", lw=0.8)
            ax.set_xlabel(xlabel)
            ax.set_ylabel("test accuracy, %")
            ax.set_ylim(max(0.0, target - 25), min(100.0, target + 5))
            ax.set_title(f"{noise:.0%} label noise (mean over seeds)")
            ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(
    out: Path, *, runs: list[Row], notes: Row, config: Row, total_s: float, command: str,
    stem: str = "time_to_accuracy",
) -> list[Path]:  # fmt: skip
    """Write ``{stem}.{md,csv,png}`` into ``out`` and return their paths (``stem`` names the
    protocol's files: ``_tta_protocol.output_stem``)."""
    out.mkdir(parents=True, exist_ok=True)
    methods = list(dict.fromkeys(r["method"] for r in runs))
    noises = sorted({r["noise"] for r in runs})
    md, csv_path, png = (out / f"{stem}.{e}" for e in ("md", "csv", "png"))
    write_csv(csv_path, runs)
    write_plot(png, runs, methods, noises)
    protocol = notes.get("protocol", EQUAL_CANDIDATES)
    regime, stops = notes["regime"], notes.get("stops")
    goals = verdicts(runs, methods, noises, regime, config["start"], stops, protocol=protocol)
    text = [
        *_head(notes, config, total_s, command),
        "## Targets",
        "",
        *goals,
        "",
        "## Results (mean ± std over seeds)",
        "",
        *aggregate_table(runs, methods, noises),
        "",
        f"Per run: [`{csv_path.name}`]({csv_path.name}). Plot: accuracy against training wall "
        "time (top) and against backpropagated samples (bottom), one column per noise level; "
        "the dashed line is the plain run's mean final accuracy.",
        "",
        f"![time to accuracy]({png.name})",
        "",
    ]
    md.write_text("\n".join(text) + "\n")
    return [md, csv_path, png]


def _irreducible_note(notes: Row) -> str:
    return (
        ", ".join(
            f"noise {n['noise']:.0%} seed {n['seed']}: {n['wall_s']:.1f}s, "
            f"test acc {n['test_acc']:.1%}"
            for n in notes["il"]
        )
        or "not run"
    )


def _head(notes: Row, config: Row, total_s: float, command: str) -> list[str]:
    """The page's title, command, machine, protocol, setup and regime."""
    protocol = notes.get("protocol", EQUAL_CANDIDATES)
    title = "" if protocol == EQUAL_CANDIDATES else ", equal backprop batch"
    return [
        f"# Time to accuracy: Selective Backprop policies on MNIST-1D{title}",
        "",
        "Generated by `benchmarks/time_to_accuracy.py` (issue 11). Reproduce with:",
        "",
        f"    {command}",
        "",
        f"Machine: 2 CPU cores (`torch.set_num_threads({torch.get_num_threads()})`), torch "
        f"{torch.__version__}, "
        f"Python {platform.python_version()}; the whole study took {total_s / 60:.1f} min. "
        "The machine may be shared with other jobs, so wall times carry noise; within a seed "
        "and noise level the methods' runs advance interleaved, half an epoch each in turn "
        "(the order rotated per seed), so it spreads over every method.",
        "",
        "## Setup",
        "",
        f"- {PROTOCOL_NOTES[protocol]}",
        f"- Config: `{config}`; loader batch per method: `{notes.get('loader_batch')}`.",
        *SETUP_NOTES,
        "- RHO-LOSS irreducible-loss model (not charged to RHO-LOSS's wall time): "
        f"{_irreducible_note(notes)}.",
        f"- Compile time per method (s, excluded from every wall time): `{notes['compile_s']}`; "
        "graphs compiled during the timed runs (the irreducible-loss models' included): "
        f"{notes.get('graphs_in_runs', 'not counted')}.",
        "",
        "## Regime",
        "",
        "One interleaved loop with the study's compiled steps: a plain step at the study's "
        "batch (`T_full`), a plain step on the kept fraction of an SB step's loader batch "
        "(`T_kept`), the scoring forward of that batch (`T_score`) and SB steps inside their "
        "window; `ideal = T_full / (r (T_score + T_kept))`, `r` SB steps per plain step in an "
        "epoch (1 when every method loads the same batches), is what SB at scale 1 can save "
        "per epoch on this model:",
        "",
        f"`{notes['regime']}`",
        "",
    ]


SETUP_NOTES = [
    "- Budget: the same number of epochs for every method (see the protocol); same initial "
    "weights per seed. SB methods backprop fewer samples and may not reach the plain run's "
    "final accuracy at all ('reached' counts the seeds that did).",
    "- Every method, plain included: `torch.compile` of its `make_train_step` (one compiled "
    "step per method shared by all runs, warmed up before timing), Adam with a cosine "
    "learning rate decayed to zero over the run (Kaddour et al. 2023).",
    "- Wall time: training only (the test-set evaluation, `evals_per_epoch` points per epoch, "
    "is untimed). Forward samples count the scoring forwards (policies that record the "
    "training forward's losses score only the rows that need it) plus the training forwards.",
    "- Every SB method runs `SelectiveBackprop(start, 1.0, interrupt=0, policy=...)` on "
    "`(x, y, ids)` batches: a plain warm-up for the first `start` of training, then every "
    "batch is scored and pruned. Kept fraction 0.5 for the fixed-count policies "
    "(`rank_power`, `rank_power_s0.5` scoring at half the input length, `top_k`, `random`, "
    "`loshchilov` with s_e=100 and max_age=2 epochs, `loshchilov_noage` the same without "
    "max_age (a row is scored once, then only the training forward of the kept rows updates "
    "its loss), `grad_norm`, `rho_loss`), beta=1 (about 50%) for `jiang_var` (a "
    "variable-size batch every step) and `stale_sb` (max_age=2 epochs), `infobatch` with "
    "r=0.5 and delta=0.875. `stale_sb`, both `loshchilov` and `infobatch` reuse the training "
    "forward's losses of the kept rows (`reuse_losses`).",
    "- `grad_norm`: scores are the logit-gradient norm `||softmax(z) - onehot(y)||` "
    "(`per_sample_loss(model, logit_grad_norm)` as the scoring function), unbiased weights "
    "feed the weighted loss; the tau switch is on.",
    "- `rho_loss`: irreducible loss per sample id from the same CNN trained on a held-out "
    "split with the same label-noise rate (same cosine schedule, `il_epochs` epochs), scored "
    "once in eval mode on the (noisy) training labels.",
    "- Mislabelled share: a small algorithm on `AFTER_LOSS` counts the backpropagated rows "
    "whose id was flipped (a tensor in `algorithm_state`, read once after the run).",
    "- Not in this run (compiled-step graphs not frozen for a refilled queue, and the time "
    "budget): `jiang_cdf` with `refill`; see the previous study in the git history.",
]
