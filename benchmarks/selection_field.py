"""The field's comparison table on MNIST-1D: data-selection methods at fixed budgets (issue 28).

Methods: full training; uniform at the same k (``random_subset(b)``); train-loss top-k
(``top_k(b)``); ``rank_power(b)``; grad-norm importance (``grad_norm_importance(b)`` scored by
the logit-gradient norm); Loshchilov at the same budget; RHO-LOSS (``rho_loss(b, irreducible)``
with the holdout-trained irreducible-loss model); InfoBatch aimed at the budget (delta = 1, no
annealing; ``r = min(0.99, (1 - b) / 0.7)``, whose expected kept share is ``b`` when 70% of
the rows sit below the mean recorded loss; the measured share is in the table); DivBS
(``divbs(b)``) and the Bayesian policy (``bayesian(b, reference_losses=irreducible)``). Budgets
0.1, 0.2, 0.3 on MNIST-1D clean and with 20% symmetric label noise, 3 seeds.

One protocol for every method (the pieces of ``benchmarks/time_to_accuracy.py``): the same
candidate batches (the loader order per seed), Adam with a cosine learning rate to zero over
the run, the same initial weights per seed and the same epochs; selection is active from the
first step (no plain warm-up), so every fixed-count method backpropagates ``b`` of the rows.
One compiled step per method and budget serves every seed and dataset (compile time is
excluded and reported; every step is warmed up twice, once when compiled and once after every
step is compiled); the runs of one seed and dataset advance interleaved, half an epoch
each in turn, so the machine's drift falls on every method alike. Reported per dataset,
budget and method: final test accuracy, epochs to a target (full training's mean final
accuracy minus ``--margin``), training wall time per epoch (evaluation excluded) and its ratio
to full, and whether the method beats uniform at the same k.

``--protocol equal-backprop`` (issue 37; ``_tta_protocol.py``) runs the papers' protocol
instead of the default ``equal-candidates`` above: full training trains on batches of
``--batch`` rows (32 by default there: RHO-LOSS's 32 of 320 candidates at 10%), each method
at budget ``b`` loads ``candidate_batch_size(batch, b)`` candidates a step and backpropagates
about ``batch`` of them, for the same epochs over the training set (so about ``b`` times full
training's steps, each run's cosine schedule decaying to zero at its own step count), still
interleaved half an epoch each in turn; ``--write`` then writes
``selection_field_equal_backprop.{md,csv}``, so the committed results stay.

Run: ``python benchmarks/selection_field.py`` (about 25 minutes on 2 CPU cores; ``--write``
writes ``docs/results/selection_field.{md,csv}``) or ``--smoke`` (eager steps, seconds). A
longer regime: ``--rows 8000 --epochs 8`` (the time-to-accuracy study's data and epochs, where
full training levels off), e.g. at the papers' headline budget only, ``--budgets 0.1``.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: see time_to_accuracy.py

import argparse
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
import torch._dynamo
from tqdm.auto import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _field_report import render, write_csv
from _tta_methods import methods
from _tta_protocol import EQUAL_BACKPROP, EQUAL_CANDIDATES, PROTOCOLS, method_config, output_stem
from _tta_train import graphs_compiled, rehearse
from time_to_accuracy import (
    Config,
    Episode,
    Run,
    Setup,
    Trainer,
    compile_method,
    episode,
    eval_stops,
    il_trainer,
    interleave,
    one_run,
    seed_init,
    setup,
)

FIELD = Config(num_samples=10000, train=4000, holdout=4000, epochs=6, batch=256, width=64,
               start=0.0, evals_per_epoch=2, il_epochs=15)  # fmt: skip
SMOKE = Config(num_samples=1000, train=384, holdout=256, epochs=2, batch=64, width=16,
               start=0.0, evals_per_epoch=1, il_epochs=2, seeds=(0,), noises=(0.2,))  # fmt: skip
BUDGETS, SMOKE_BUDGETS = (0.1, 0.2, 0.3), (0.2,)
EQUAL_BACKPROP_BATCH = 32  # --batch's default under equal-backprop (RHO-LOSS: 32 of 320)
# the shared table's names; the report calls plain "full" and random "uniform"
FIELD_METHODS = ("plain", "random", "top_k", "rank_power", "grad_norm", "loshchilov",
                 "rho_loss", "infobatch_budget", "divbs", "bayesian")  # fmt: skip
NEEDS_IRREDUCIBLE = frozenset({"rho_loss", "bayesian"})
Entry = tuple[str, float]  # (method, budget); full training has budget 1.0


def entry_configs(cfg: Config, names: list[str], budgets: tuple[float, ...],
                  protocol: str) -> dict[Entry, Config]:  # fmt: skip
    """Every method and budget (full training once, at budget 1.0) with its config: its
    loader batch under ``protocol`` (:func:`_tta_protocol.method_config`)."""
    entries = [("plain", 1.0)] if "plain" in names else []
    entries += [(m, b) for b in budgets for m in names if m != "plain"]
    return {(m, b): method_config(cfg, m, protocol, keep=b) for m, b in entries}


def compile_all(cfg: Config, s: Setup, cfgs: dict[Entry, Config], *,
                compile: bool) -> dict[Entry, Trainer]:  # fmt: skip
    """One trainer per method and budget in ``cfgs``, built from the shared table."""
    budgets = {b for _, b in cfgs}
    tables = {b: methods(cfg, s.loss_fn, s.grad_norm_fn, keep=b) for b in budgets}
    return {
        (m, b): compile_method(c, s, tables[b][m](), compile=compile)
        for (m, b), c in tqdm(cfgs.items(), desc="compile", unit="step")
    }


def summarise(run: Run, budget: float, cfg: Config) -> dict[str, Any]:
    """A run as a report row: the curve as (epoch, accuracy) points, shares of the loaded rows
    (``cfg`` is the run's own: its loader batch)."""
    per_epoch = cfg.train // cfg.batch
    epochs = [stop / per_epoch for stop in eval_stops(cfg, cfg.epochs, per_epoch)]
    rows = cfg.epochs * per_epoch * cfg.batch
    return {
        "method": run.method, "budget": budget, "noise": run.noise, "seed": run.seed,
        "final_acc": run.final_acc, "best_acc": run.best_acc, "wall_s": run.wall_s,
        "wall_per_epoch_s": run.wall_s / cfg.epochs, "bwd_share": run.backprop_samples / rows,
        "fwd_share": run.forward_samples / rows, "mislabelled_share": run.mislabelled_share,
        "curve": [(e, p[4]) for e, p in zip(epochs, run.curve, strict=True)],
    }  # fmt: skip


def run_episode(trainers: dict[Entry, Trainer], order: list[Entry], s: Setup, e: Episode,
                init: tuple[dict, dict], cfgs: dict[Entry, Config], seed: int, noise: float,
                bar: Any) -> list[dict[str, Any]]:  # fmt: skip
    """Every method and budget on one seed and dataset, interleaved half an epoch at a time
    (in ``order``), each with its own config (``cfgs``)."""
    eval_fn = s.loss_fn.with_mode("eval")
    runs = interleave([
        one_run(m, trainers[(m, b)], init, s.d.x, e.y, e.flipped, e.irreducible,
                cfg=cfgs[(m, b)], seed=seed, noise=noise, key=e.key, d=s.d, eval_fn=eval_fn)
        for m, b in order
    ])  # fmt: skip
    bar.update(len(order))
    return [summarise(run, b, cfgs[(m, b)]) for run, (m, b) in zip(runs, order, strict=True)]


def run_field(cfg: Config, names: list[str], budgets: tuple[float, ...], *, compile: bool,
              protocol: str = EQUAL_CANDIDATES,
              ) -> tuple[list[dict[str, Any]], dict[str, Any]]:  # fmt: skip
    """All runs under ``protocol``, seed-major (seed -> dataset; within one, every method and
    budget interleaved half an epoch at a time, the order rotated per seed), and the notes
    (protocol, loader batches, compile times, irreducible-loss models, the graphs compiled
    during the runs)."""
    s = setup(cfg)
    cfgs = entry_configs(cfg, names, budgets, protocol)
    trainers = compile_all(cfg, s, cfgs, compile=compile)
    il = il_trainer(cfg, s, compile=compile) if NEEDS_IRREDUCIBLE & set(names) else None
    trainers = rehearse(trainers, cfgs, s.init0, s.d.x, s.d.y) if compile else trainers
    compile_s = {f"{m}@{b}": round(t.compile_s, 1) for (m, b), t in trainers.items()}
    loader = {f"{m}@{b}": c.batch for (m, b), c in cfgs.items()}
    notes: dict[str, Any] = {"protocol": protocol, "loader_batch": loader,
                             "compile_s": compile_s, "il": []}  # fmt: skip
    entries, rows = list(trainers), []
    bar = tqdm(total=len(cfg.seeds) * len(cfg.noises) * len(entries), desc="runs", unit="run")
    before = graphs_compiled()
    for si, seed in enumerate(cfg.seeds):
        init = seed_init(cfg, seed)
        order = entries[si % len(entries) :] + entries[: si % len(entries)]
        for noise in cfg.noises:
            e = episode(cfg, s, il, init, seed, noise, notes["il"])
            rows += run_episode(trainers, order, s, e, init, cfgs, seed, noise, bar)
    bar.close()
    notes["graphs_in_runs"] = graphs_compiled() - before
    return rows, notes


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny eager run for CI")
    parser.add_argument("--compiled", action="store_true", help="compile in --smoke too")
    parser.add_argument("--write", action="store_true", help="write selection_field.{md,csv}")
    parser.add_argument("--out", type=Path, default=Path("docs/results"), help="--write folder")
    parser.add_argument("--methods", nargs="+", default=list(FIELD_METHODS),
                        choices=FIELD_METHODS)  # fmt: skip
    parser.add_argument("--budgets", type=float, nargs="+", default=None, help="kept fractions")
    parser.add_argument("--protocol", choices=PROTOCOLS, default=EQUAL_CANDIDATES,
                        help="equal-candidates: every method loads batch rows a step; "
                        "equal-backprop: full training loads batch, a method at budget b "
                        "batch / b and backpropagates batch")  # fmt: skip
    parser.add_argument("--batch", type=int, default=None,
                        help="the (backprop) batch: the config's, or "
                        f"{EQUAL_BACKPROP_BATCH} under equal-backprop")  # fmt: skip
    parser.add_argument("--seeds", type=int, default=None, help="number of seeds")
    parser.add_argument("--epochs", type=int, default=None, help="override the epochs")
    parser.add_argument("--rows", type=int, default=None,
                        help="training rows (as many held out), not 4,000")  # fmt: skip
    parser.add_argument("--margin", type=float, default=0.02,
                        help="target = full's mean final accuracy minus this")  # fmt: skip
    return parser.parse_args()


def config(args: argparse.Namespace) -> tuple[Config, tuple[float, ...]]:
    """The field's config and budgets: ``FIELD`` or ``SMOKE`` with the command line's
    overrides (the batch: ``EQUAL_BACKPROP_BATCH``, at most the config's, under
    equal-backprop unless ``--batch`` says)."""
    cfg, budgets = (SMOKE, SMOKE_BUDGETS) if args.smoke else (FIELD, BUDGETS)
    if args.budgets is not None:
        budgets = tuple(args.budgets)
    if args.seeds is not None:
        cfg = replace(cfg, seeds=tuple(range(args.seeds)))
    if args.epochs is not None:
        cfg = replace(cfg, epochs=args.epochs)
    if args.rows is not None:  # generated: 80% train part (train + holdout), 20% test
        if args.rows < 64:
            raise SystemExit(f"--rows must be >= 64, got {args.rows}")
        cfg = replace(cfg, train=args.rows, holdout=args.rows, num_samples=args.rows * 5 // 2)
    if args.batch is not None:
        cfg = replace(cfg, batch=args.batch)
    elif args.protocol == EQUAL_BACKPROP:
        cfg = replace(cfg, batch=min(cfg.batch, EQUAL_BACKPROP_BATCH))
    return cfg, budgets


def main() -> None:
    args = parse()
    torch.set_num_threads(2)
    torch._dynamo.config.recompile_limit = 256  # as time_to_accuracy.py: no eager fallbacks
    torch._dynamo.config.accumulated_recompile_limit = 4096
    cfg, budgets = config(args)
    names = ["plain", *[m for m in args.methods if m != "plain"]]
    compile = args.compiled or not args.smoke
    print(f"config: {asdict(cfg)}; budgets {budgets}; methods {names}; protocol "
          f"{args.protocol}; {'compiled' if compile else 'eager'} steps")  # fmt: skip
    start = time.perf_counter()
    rows, notes = run_field(cfg, names, budgets, compile=compile, protocol=args.protocol)
    total = time.perf_counter() - start
    command = " ".join(["python benchmarks/selection_field.py", *sys.argv[1:]])
    text = render(rows, notes=notes, config=asdict(cfg), margin=args.margin, total_s=total,
                  command=command)  # fmt: skip
    print(text)
    if args.write:
        args.out.mkdir(parents=True, exist_ok=True)
        stem = output_stem("selection_field", args.protocol)
        md, csv_path = args.out / f"{stem}.md", args.out / f"{stem}.csv"
        md.write_text(text)
        write_csv(csv_path, rows)
        print(f"wrote {md}, {csv_path}")
    print(f"total {total / 60:.1f} min")


if __name__ == "__main__":
    main()
