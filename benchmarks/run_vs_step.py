"""Does a whole Selective Backprop run reach its step-level speed-up? Three grains, one process.

The time-to-accuracy study's plain step and SB steps (default: rank-power; ``--methods`` takes
any of the study's methods; width-96 CNN on MNIST-1D, batch 256, keep 0.5, Adam + cosine, all
compiled with ``step.compile()`` and warmed up), timed at three grains (``--grains``), each
alternating the methods so that the machine's drift falls on all of them:

* ``step``: single steps, interleaved A B A B (the study's regime; SB inside its window);
* ``epoch``: blocks of one epoch of consecutive steps (31), alternating A B B A ...;
* ``run``: whole ``sbfunc.fit`` runs of the study (8 epochs, SB from 10% of training, as the
  study runs them but without its evaluation pauses), alternating A B B A ...

It prints each grain's median per-step (or per-run) times and each method's ratio to plain per
round: median [min-max]. A whole run's expected ratio is the step ratio weighted by the share
of steps inside SB's window; the ``run`` grain also times each step inside the runs and each
run's process CPU time (all threads: the work done, which a wall ratio above it shows the
threads idle through).

Run: ``python benchmarks/run_vs_step.py`` (``--rounds`` rounds per grain, default 6;
``--quick``: the study's quick sizes, with ``--eager`` a smoke run; ``--threads``, default 2),
e.g. ``--methods rank_power loshchilov --grains run``.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # a shared machine: see compiled_step.py

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import sbfunc
from sbfunc import random as sbrandom

sys.path.insert(0, str(Path(__file__).resolve().parent))
import time_to_accuracy as tta

GRAINS = ("step", "epoch", "run")


def trainers(cfg: tta.Config, d: tta.Data, init: tuple[dict, dict],
             loss_fn: sbfunc.module.ModuleLoss, names: list[str], *,
             compile: bool = True) -> dict[str, tta.Trainer]:  # fmt: skip
    """Each method's trainer, compiled and warmed up (eager with ``compile=False``)."""
    table = tta.methods(cfg, loss_fn, loss_fn)
    steps = cfg.epochs * (cfg.train // cfg.batch)
    out = {}
    for name in names:
        algorithms = [*table[name](), tta.Audit(cfg.train)]
        trainer = tta.build(cfg, algorithms, loss_fn, steps, compile=compile)
        out[name] = tta.warm_up(trainer, init, d.x, d.y, cfg) if compile else trainer
    return out


def alternate(fns: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """``rounds`` rounds, the order reversed every round (A B C, C B A, ...)."""
    names = list(fns)
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for n in names if r % 2 == 0 else names[::-1]:
            out[n].append(fns[n]())
    return out


def report(grain: str, unit: str, times: dict[str, list[float]], scale: float) -> None:
    parts = [f"{n} {statistics.median(v) * scale:.1f} {unit}" for n, v in times.items()]
    print(f"{grain:6} {', '.join(parts)}")
    for name, own in times.items():
        if name != "plain":
            ratios = [s / p for s, p in zip(own, times["plain"], strict=True)]
            print(f"       {name} / plain {statistics.median(ratios):.2f} "
                  f"[{min(ratios):.2f}-{max(ratios):.2f}] over {len(ratios)} rounds")  # fmt: skip


class Stamped:
    """The study's loader for ``fit``, noting when each batch is asked for and how long the
    loader takes to make it: the gap between two asks is one step of the run (with ``fit``'s
    own work between steps), and the loader's share of it is measured apart."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch: int, key: torch.Tensor) -> None:
        self.x, self.y, self.batch, self.key = x, y, batch, key
        self.asked: list[float] = []
        self.loading: list[float] = []

    def __call__(self, epoch: int) -> Iterator[Any]:
        key = sbrandom.fold_in(self.key, epoch)
        inner = iter(sbfunc.datasets.batches(self.x, self.y, self.batch, key=key))
        while True:
            t0 = time.perf_counter()
            batch = next(inner, None)
            if batch is None:
                return
            self.asked.append(t0)
            self.loading.append(time.perf_counter() - t0)
            yield batch

    def close(self, end: float) -> Stamped:
        """Note the run's end (the last step's end): ``steps()`` is then defined."""
        self.asked.append(end)
        return self

    def steps(self) -> list[float]:
        """Each step's time in the run, the loader excluded (gap between asks less loading)."""
        gaps = [b - a for a, b in pairwise(self.asked)]
        return [g - load for g, load in zip(gaps, self.loading, strict=True)]


def profile(loaders: dict[str, list[Stamped]], start: float) -> None:
    """A whole run's steps against the single-step grain: the median step before SB's window
    and inside it, the loader's share, and the run ratio those steps predict."""
    inside: dict[str, float] = {}
    for name, runs in loaders.items():
        steps = [r.steps() for r in runs]
        cut = round(start * len(steps[0]))
        before = statistics.median(statistics.median(s[:cut]) for s in steps)
        inside[name] = statistics.median(statistics.median(s[cut:]) for s in steps)
        load = statistics.median(sum(r.loading) / len(r.loading) for r in runs)
        print(f"in-run {name:10} step before the window {before * 1e3:.1f} ms, inside it "
              f"{inside[name] * 1e3:.1f} ms; loader {load * 1e6:.0f} us a batch")  # fmt: skip
    for name in inside:
        if name != "plain":
            r = inside[name] / inside["plain"]
            print(f"in-run {name} / plain step ratio {r:.2f}: a run's predicted ratio "
                  f"{start + (1 - start) * r:.2f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds per grain (>= 1)")
    parser.add_argument("--quick", action="store_true", help="the study's quick sizes")
    names = [n for n in tta.methods(tta.QUICK, None, None) if n != "plain"]  # type: ignore[arg-type]
    parser.add_argument("--methods", nargs="+", default=["rank_power"], choices=names,
                        help="SB methods timed against plain")  # fmt: skip
    parser.add_argument("--grains", nargs="+", default=list(GRAINS), choices=GRAINS)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (>= 1)")
    parser.add_argument("--eager", action="store_true", help="eager steps (a smoke run)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    chosen = ["plain", *dict.fromkeys(args.methods)]
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    cfg = tta.QUICK if args.quick else tta.FULL
    d = tta.load_data(cfg)
    torch.manual_seed(0)
    model = tta.make_model(cfg.width)
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    init = sbfunc.split_module(model, clone=True)
    methods = trainers(cfg, d, init, loss_fn, chosen, compile=not args.eager)
    batches = list(sbfunc.datasets.batches(d.x, d.y, cfg.batch, key=sbrandom.key(9)))
    states = {}
    for name, trainer in methods.items():  # mid-run of a long run: inside SB's window
        s = trainer.step.init(*init, key=sbrandom.key(0), total_steps=2**20)
        states[name] = s._replace(time=s.time._replace(step=2**19, elapsed=0.5))
    print(f"torch {torch.__version__}, sbfunc {sbfunc.__version__}, {args.threads} threads, width "
          f"{cfg.width}, batch {cfg.batch}, {len(batches)} steps per epoch")  # fmt: skip

    def steps(name: str, count: int) -> Callable[[], float]:
        def run() -> float:
            t0 = time.perf_counter()
            for i in range(count):
                states[name] = methods[name].compiled(states[name], batches[i % len(batches)])[0]
            return (time.perf_counter() - t0) / count

        return run

    loaders: dict[str, list[Stamped]] = {n: [] for n in chosen}
    cpu: dict[str, list[float]] = {n: [] for n in chosen}  # each whole run's process CPU time

    def whole(name: str) -> Callable[[], float]:
        def run() -> float:
            state = methods[name].step.init(*init, key=sbrandom.key(5))
            data = Stamped(d.x, d.y, cfg.batch, sbrandom.key(3))
            t0, c0 = time.perf_counter(), time.process_time()
            sbfunc.fit(methods[name].compiled, state, data, epochs=cfg.epochs,
                       steps_per_epoch=len(batches), progress=False, history=False)  # fmt: skip
            wall = time.perf_counter() - t0
            cpu[name].append(time.process_time() - c0)
            loaders[name].append(data.close(t0 + wall))
            return wall

        return run

    if "step" in args.grains:
        report("step", "ms", alternate({n: steps(n, 1) for n in chosen}, 16 * args.rounds), 1e3)
    if "epoch" in args.grains:
        per_epoch = {n: steps(n, len(batches)) for n in chosen}
        report("epoch", "ms", alternate(per_epoch, args.rounds), 1e3)
    if "run" in args.grains:
        report("run", "s", alternate({n: whole(n) for n in chosen}, args.rounds), 1.0)
        report("run", "CPU s", cpu, 1.0)  # process CPU time, all threads: the work done
        profile(loaders, cfg.start)
    inside = 1.0 - cfg.start
    print(f"a run's expected SB / plain from the step ratio r: {1 - inside:.2f} + {inside:.2f} r "
          "(SB's window is the last 90% of the steps)")  # fmt: skip


if __name__ == "__main__":
    main()
