"""The language-model study's outputs: ``language_models.{md,csv,png}``."""

from __future__ import annotations

import csv
import itertools
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _lm_data import KINDS, Config
from _lm_methods import METHODS, NEW, REFERENCES, charges
from _lm_timing import ratios

Row = dict[str, Any]
TARGETS = {"tokens": 0.7, "wall": 0.85, "better": 0.05, "step": 1.05}


def crossing(curve: Sequence[Sequence[float]], target: float) -> float | None:
    """The first step at which ``curve`` (``(step, loss)`` points) reaches ``target``,
    linearly interpolated between evaluations; ``None`` if it never does."""
    for (s0, l0), (s1, l1) in itertools.pairwise(curve):
        if l1 <= target:
            return s1 if l0 == l1 else s0 + (s1 - s0) * max(0.0, l0 - target) / (l0 - l1)
    return None


def _median(times: dict[str, list[float]], name: str) -> float:
    return statistics.median(times[name])


def annotate(runs: list[Row], times: dict[str, list[float]], cfg: Config) -> list[Row]:
    """Each run with its tokens and wall-clock to plain's final loss (same seed and stream),
    as fractions of plain's run, the reference's cost charged (:func:`_lm_methods.charges`)."""
    plain = {(r["seed"], r["stream"]): r for r in runs if r["method"] == "plain"}
    full = _median(times, "plain")
    out = []
    for r in runs:
        base = plain[(r["seed"], r["stream"])]
        step = crossing(r["curve"], base["final"])
        charge = sum(
            _median(times, cost) * count for cost, count in charges(cfg, r["method"], r["steps"])
        )
        own = _median(times, r["method"] if r["method"] in times else "plain")
        per_step, charged = own / (r["total_steps"] * full), charge / (r["total_steps"] * full)
        out.append(
            r
            | {
                "delta": r["final"] - base["final"],
                "tokens_to_plain": None if step is None else step / r["total_steps"],
                "wall_to_plain": None if step is None else charged + step * per_step,
                "wall_total": charged + r["steps"] * per_step,
                "wall_per_step": per_step,
                "wall_charged": charged,
            }
        )
    return out


def _fmt(values: Sequence[float | None], fmt: str = "{:.2f}") -> str:
    return " / ".join("never" if v is None else fmt.format(v) for v in values)


def _mean_std(values: Sequence[float], fmt: str = "{:.3f}") -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{fmt.format(statistics.mean(values))} ± {fmt.format(sd)}"


def results_table(runs: list[Row], stream: str) -> list[str]:
    lines = [
        "| method | lr | final held-out loss | vs plain (per seed) | tokens to plain's final "
        "(per seed) | wall-clock to plain's final | whole run's wall-clock | kept: code / random "
        "/ English |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in METHODS:
        g = sorted(
            (r for r in runs if r["stream"] == stream and r["method"] == name),
            key=lambda r: r["seed"],
        )
        if not g:
            continue
        kept = (
            " / ".join(f"{statistics.mean(r['kept_by_kind'][k] for r in g):.2f}" for k in KINDS)
            if stream == "mixed"
            else "-"
        )
        lines.append(
            f"| {name} | {g[0]['lr']:g} | {_mean_std([r['final'] for r in g])} | "
            f"{_fmt([r['delta'] for r in g], '{:+.3f}')} | "
            f"{_fmt([r['tokens_to_plain'] for r in g])} | {_fmt([r['wall_to_plain'] for r in g])}"
            f" | {statistics.mean(r['wall_total'] for r in g):.2f} | {kept} |"
        )
    return lines


def tuning_table(tuning: list[Row]) -> list[str]:
    lines = [
        "| stream | method | "
        + " | ".join(f"lr {lr:g}" for lr in sorted({r["lr"] for r in tuning}))
        + " |"
    ]
    lines.append("|---|---|" + "---|" * (len(lines[0].split("|")) - 4))
    for stream in ("mixed", "clean"):
        for name in ("plain", "selective LM"):
            g = sorted(
                (r for r in tuning if r["stream"] == stream and r["method"] == name),
                key=lambda r: r["lr"],
            )
            if g:
                lines.append(
                    f"| {stream} | {name} | " + " | ".join(f"{r['final']:.3f}" for r in g) + " |"
                )
    return lines


def cost_table(times: dict[str, list[float]]) -> list[str]:
    lines = ["| step | median ms | ratio to plain's step (q1, median, q3) |", "|---|---|---|"]
    for name, (q1, med, q3) in ratios(times).items():
        lines.append(
            f"| {name} | {1e3 * _median(times, name):.1f} | {med:.3f} ({q1:.3f}, {q3:.3f}) |"
        )
    return lines


def floor(runs: list[Row]) -> list[str]:
    """The floor for any filter of the mixed stream: plain on the clean stream (no off-target
    row at all), its tokens to the mixed plain run's final loss and its own final loss."""
    pairs = [
        (clean, mixed)
        for clean in runs
        for mixed in runs
        if clean["method"] == mixed["method"] == "plain"
        and clean["seed"] == mixed["seed"]
        and (clean["stream"], mixed["stream"]) == ("clean", "mixed")
    ]
    if not pairs:
        return []
    hits = [crossing(c["curve"], m["final"]) for c, m in pairs]
    tokens = [
        None if t is None else t / c["total_steps"] for t, (c, _) in zip(hits, pairs, strict=True)
    ]
    return [
        "- The floor for any filter (a perfect one leaves the clean stream): plain on the clean "
        f"stream reaches the mixed plain run's final loss at {_fmt(tokens)} of the tokens and"
        f" ends {_fmt([c['final'] - m['final'] for c, m in pairs], '{:+.3f}')} nats from it"
        " (per seed).",
    ]


def _ok(flag: bool) -> str:
    return "met" if flag else "**missed**"


def _checks(g: list[Row]) -> dict[str, tuple[bool, str]]:
    """Issue 36's three targets on ``g`` (one method's runs, every seed): met, and figures."""
    tok = [r["tokens_to_plain"] for r in g]
    wall = [r["wall_to_plain"] for r in g]
    delta = [r["delta"] for r in g]
    return {
        "tokens": (all(t is not None and t <= TARGETS["tokens"] for t in tok), _fmt(tok)),
        "wall": (all(w is not None and w <= TARGETS["wall"] for w in wall), _fmt(wall)),
        "better": (all(d <= -TARGETS["better"] for d in delta), _fmt(delta, "{:+.3f}")),
    }


def _group(runs: list[Row], stream: str, name: str) -> list[Row]:
    return sorted(
        (r for r in runs if r["stream"] == stream and r["method"] == name),
        key=lambda r: r["seed"],
    )


def verdicts(runs: list[Row], times: dict[str, list[float]]) -> list[str]:
    """The issue's targets, each checked on every seed, with the measured figures."""
    check = _checks(_group(runs, "mixed", "selective LM"))
    step = ratios(times)["uniform tokens"][1]
    return [
        *floor(runs),
        f"- Mixed stream, tokens to plain's final loss <= {TARGETS['tokens']}x on every seed: "
        f"{_ok(check['tokens'][0])} ({check['tokens'][1]}).",
        f"- Mixed stream, wall-clock to plain's final loss <= {TARGETS['wall']}x, the reference "
        f"charged: {_ok(check['wall'][0])} ({check['wall'][1]}).",
        f"- Mixed stream, final loss at least {TARGETS['better']} nats better than plain: "
        f"{_ok(check['better'][0])} ({check['better'][1]}).",
        f"- Token-selection step (mask and selection, no reference) <= {TARGETS['step']}x a "
        f"plain step: {_ok(step <= TARGETS['step'])} ({step:.3f}x, uniform tokens).",
    ]


def new_targets(runs: list[Row]) -> list[str]:
    """Issue 36's targets for issue 40's rows, per stream and seed."""
    lines = [
        f"| stream | method | tokens to plain's final <= {TARGETS['tokens']}x | wall-clock "
        f"<= {TARGETS['wall']}x, reference charged | final loss {TARGETS['better']} nats "
        "better |",
        "|---|---|---|---|---|",
    ]
    for stream in ("mixed", "clean"):
        for name in NEW:
            g = _group(runs, stream, name)
            if g:
                cells = [f"{_ok(met)} ({figures})" for met, figures in _checks(g).values()]
                lines.append(f"| {stream} | {name} | " + " | ".join(cells) + " |")
    return lines


def references_table(infos: list[Row], times: dict[str, list[float]], cfg: Config) -> list[str]:
    """Each reference: its size, clean text, steps, held-out loss and training cost."""
    lines = [
        "| reference | parameters | clean rows (mean over seeds) | training steps | held-out "
        "loss | training cost, fraction of plain's run |",
        "|---|---|---|---|---|---|",
    ]
    plain = cfg.steps * _median(times, "plain")
    for name, spec in REFERENCES.items():
        g = [i for i in infos if i["reference"] == name]
        if g:
            cost = g[0]["steps"] * _median(times, f"{spec.label} training step") / plain
            lines.append(
                f"| {name} | {g[0]['parameters']:,} | "
                f"{statistics.mean(i['rows'] for i in g):,.0f} | {g[0]['steps']} | "
                f"{_mean_std([i['heldout'] for i in g])} | {cost:.2f} |"
            )
    return lines


def write_csv(path: Path, runs: list[Row]) -> None:
    keys = [
        "stream",
        "method",
        "seed",
        "lr",
        "steps",
        "final",
        "delta",
        "tokens_to_plain",
        "wall_to_plain",
        "wall_total",
    ] + [f"kept_{k}" for k in KINDS]
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(keys)
        for r in runs:
            w.writerow([r[k] for k in keys[:-3]] + [r["kept_by_kind"][k] for k in KINDS])


def write_plot(path: Path, runs: list[Row], times: dict[str, list[float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    streams = [s for s in ("mixed", "clean") if any(r["stream"] == s for r in runs)]
    fig, axes = plt.subplots(len(streams), 2, figsize=(13, 4.8 * len(streams)), squeeze=False)
    colors = plt.get_cmap("tab10").colors  # type: ignore[attr-defined]
    for i, stream in enumerate(streams):
        for j, name in enumerate(METHODS):
            g = [r for r in runs if r["stream"] == stream and r["method"] == name]
            if not g:
                continue
            n = min(len(r["curve"]) for r in g)
            steps = [g[0]["curve"][t][0] for t in range(n)]
            loss = [statistics.mean(r["curve"][t][1] for r in g) for t in range(n)]
            total = g[0]["total_steps"]
            wall = [g[0]["wall_charged"] + s * g[0]["wall_per_step"] for s in steps]
            style: dict[str, Any] = {"color": colors[j % len(colors)]}
            if name == "plain":
                style = {"color": "black", "lw": 2.2}
            elif name in NEW:  # issue 40's rows
                style["ls"] = "--"
            axes[i][0].plot([s / total for s in steps], loss, label=name, **style)
            axes[i][1].plot(wall, loss, label=name, **style)
        target = statistics.mean(
            r["final"] for r in runs if r["stream"] == stream and r["method"] == "plain"
        )
        for j, xlabel in enumerate(
            (
                "training tokens (fraction of plain's)",
                "wall-clock (fraction of plain's run), reference charged",
            )
        ):
            ax = axes[i][j]
            ax.axhline(target, color="gray", ls="--", lw=0.8)
            ax.set_xlabel(xlabel)
            ax.set_ylabel("held-out loss, nats per byte")
            ax.set_ylim(target - 0.15, target + 0.8)
            ax.set_title(f"{stream} stream (mean over seeds)")
            ax.grid(alpha=0.3)
    axes[0][1].legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


NOTES = "<!-- notes: written by hand, kept when the study reruns -->"


def _notes(md: Path) -> str:
    """The hand-written reading after :data:`NOTES` in an existing report, kept as it is."""
    text = md.read_text() if md.exists() else ""
    return "\n" + text[text.index(NOTES) :] if NOTES in text else ""


def write_outputs(
    out: Path,
    *,
    runs: list[Row],
    tuning: list[Row],
    references: list[Row],
    lrs: dict[str, Any],
    timing: dict[str, list[float]],
    config: Row,
    command: str,
) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    cfg = Config(**config)
    runs = annotate(runs, timing, cfg)
    md, csv_path, png = (out / f"language_models.{e}" for e in ("md", "csv", "png"))
    lines = [
        "# Language models: token and sequence selection on the shipped corpus",
        "",
        f"Produced by `{command}` (`benchmarks/language_model.py` says what each method is).",
        f"Configuration: `{config}`.",
        "",
        "## Targets (issue 36)",
        "",
        *verdicts(runs, timing),
        "",
        "## Issue 40's rows against the same targets (every seed)",
        "",
        *new_targets(runs),
        "",
    ]
    for stream in ("mixed", "clean"):
        if any(r["stream"] == stream for r in runs):
            lines += [f"## {stream.capitalize()} stream", "", *results_table(runs, stream), ""]
    lines += [
        "## Learning rates (seed 0, final held-out loss)",
        "",
        *tuning_table(tuning),
        "",
        f"Chosen: `{lrs}`.",
        "",
        "## References (trained on clean code only; held-out loss measured, never used)",
        "",
        *references_table(references, timing, cfg),
        "",
        "## Step costs (one thread, interleaved, one batch of the mixed stream)",
        "",
        *cost_table(timing),
        "",
        f"![held-out loss]({png.name})",
        "",
    ]
    md.write_text("\n".join(lines) + _notes(md))
    write_csv(csv_path, runs)
    write_plot(png, runs, timing)
    return [md, csv_path, png]
