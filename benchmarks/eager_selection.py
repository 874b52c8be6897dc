"""Eager selection against its hand-written limit, and bulk random draws (issue 37, items 1-2).

Times two builds of sbfunc side by side: the code under test and a baseline checkout (1.0.0 by
default, ``--baseline DIR``, e.g. a ``git worktree`` of the tag). Each build runs in its own
worker process (``PYTHONPATH`` set to its checkout; the worker is this file with ``--serve``);
the parent interleaves the timed blocks over every (build, row) pair, round after round, so
machine noise spreads over all of them while only one process computes at a time. It prints:

* **operator counts** (deterministic): the aten events ``torch.profiler`` records for one eager
  step on a tiny MLP (16-32-4, batch 64, 1 thread): a plain step, a hand-written SB step (a
  no-grad scoring forward, ``torch.topk``, then the same sbfunc plain step on the kept rows)
  and sbfunc's SB step (``SelectiveBackprop(keep=0.5)``, the default rank-power rule); the
  target: sbfunc's SB step adds at most twice what the hand-written one adds over plain;
* **eager SB on a 1-D CNN** (3 convolutions of width 64, batch 256, length 40, keep 0.5, 2
  threads): sbfunc's eager SB step against the hand-written eager SB step (target: >= 0.95 of
  its speed, the median of per-round ``hand / sbfunc``), and each build's plain step (the
  hand-written step's second half) against the other's;
* **Bayesian selection** on the same CNN at keep 0.1 (2 threads): the eager
  ``bayesian(0.1)`` step (default 256 draws, and ``draws=16``) against an eager uniform SB
  step (``random_subset(0.1)``; target <= 1.3x), and compiled (``step.compile()``) the
  Bayesian step of the code under test against the baseline's (target <= 1.1x).

Every ratio is the median of per-round ratios with its interquartile range, of wall-clock time
and (beside it, a steadier figure on a machine other jobs share) of the worker's CPU time;
``us/step`` is the wall-clock median with its IQR. Run: ``python
benchmarks/eager_selection.py`` (``--rounds``, ``--threads``, ``--baseline DIR``, ``--parts ops
cnn bayes``, ``--quick`` for a smoke run); wrap it in ``flock /tmp/sbfunc-timing.lock`` on a
shared machine.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: a shared machine

import argparse
import collections
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _timing import quartiles  # noqa: E402  (imports no torch)

KEEP, BAYES_KEEP, WIDTH, BATCH, LENGTH, CLASSES = 0.5, 0.1, 64, 256, 40, 10
MLP_BATCH = 64
CNN_ROWS = ("hand eager SB", "sbfunc eager SB", "sbfunc eager plain")
BAYES_ROWS = ("uniform eager", "bayesian eager", "bayesian draws=16 eager", "uniform compiled",
              "bayesian compiled")  # fmt: skip
PARTS = ("ops", "cnn", "bayes")
THREADS = [2]  # the timed rows' intra-op threads (--threads)


# --- the worker: one build of sbfunc, every row of it ---------------------------------------


def cnn() -> Any:
    """The 1-D CNN: 3 convolutions of width 64 (the last two of stride 2), a linear head."""
    from torch import nn

    c = WIDTH
    return nn.Sequential(
        nn.Conv1d(1, c, 5, padding=2), nn.ReLU(),
        nn.Conv1d(c, c, 5, stride=2, padding=2), nn.ReLU(),
        nn.Conv1d(c, c, 5, stride=2, padding=2), nn.ReLU(),
        nn.Flatten(), nn.Linear(c * LENGTH // 4, CLASSES),
    )  # fmt: skip


def mlp() -> Any:
    from torch import nn

    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def _stepper(model: Any, algorithms: list[Any], *, compiled: bool = False) -> Any:
    """``(step, state)`` of an sbfunc Adam step on ``model`` (its own copy of the weights)."""
    import torch.nn.functional as F

    import sbfunc

    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.adam(1e-3), algorithms)
    if compiled:
        step.compile()
    params, buffers = sbfunc.split_module(model, clone=True)
    return step, step.init(params, buffers, key=sbfunc.random.key(0))


def _sb(policy: Any = None, keep: float | None = None) -> Any:
    import sbfunc

    kept = {"keep": keep} if policy is None else {"policy": policy}
    return sbfunc.SelectiveBackprop(start=0.0, end=1.0, interrupt=0, **kept)


def _runner(step: Any, state: Any, batch: Any) -> Callable[[], None]:
    box = [state]

    def advance() -> None:
        box[0] = step(box[0], batch)[0]

    return advance


def _hand(model: Any, batch: Any, keep: float) -> tuple[Callable[[Any], Any], Any]:
    """The hand-written eager SB step: a no-grad scoring forward in eval mode, ``torch.topk``
    of the kept count, then sbfunc's plain step on the kept rows. ``(step, state)``."""
    import torch
    import torch.nn.functional as F

    step, state = _stepper(model, [])
    k = max(1, int(keep * batch[0].shape[0]))
    model.eval()  # the scoring forward's mode (the models here have no mode-dependent layer)

    def hand_step(s: Any, b: Any) -> Any:
        x, y = b
        with torch.no_grad():
            out = torch.func.functional_call(model, (s.params, s.buffers), (x,))
            losses = F.cross_entropy(out, y, reduction="none")
        rows = torch.topk(losses, k, sorted=False).indices
        return step(s, (x[rows], y[rows]))

    return hand_step, state


def _data(n: int, shape: tuple[int, ...], classes: int) -> Any:
    import torch

    g = torch.Generator().manual_seed(0)
    return torch.randn(n, *shape, generator=g), torch.randint(0, classes, (n,), generator=g)


def op_counts() -> dict[str, int]:
    """aten events of one eager step on the tiny MLP (1 thread): plain, hand SB, sbfunc SB."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(1)
    batch = _data(MLP_BATCH, (16,), 4)
    out = {}
    for name in ("plain", "hand SB", "sbfunc SB"):
        torch.manual_seed(0)
        model = mlp()
        if name == "hand SB":
            step, state = _hand(model, batch, KEEP)
        else:
            step, state = _stepper(model, [] if name == "plain" else [_sb(keep=KEEP)])
        for _ in range(3):
            state = step(state, batch)[0]
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step(state, batch)
        out[name] = sum(1 for e in prof.events() if e.name.startswith("aten::"))
    return out


def build_rows(part: str, threads: int) -> dict[str, Callable[[], None]]:
    """The timed rows of a part, each a zero-argument step on one fixed batch, warmed up."""
    import torch

    import sbfunc

    torch.set_num_threads(threads)
    batch = _data(BATCH, (1, LENGTH), CLASSES)
    rows: dict[str, Callable[[], None]] = {}
    if part == "cnn":
        torch.manual_seed(0)
        step, state = _hand(cnn(), batch, KEEP)
        rows["hand eager SB"] = _runner(step, state, batch)
        torch.manual_seed(0)
        rows["sbfunc eager SB"] = _runner(*_stepper(cnn(), [_sb(keep=KEEP)]), batch)
        torch.manual_seed(0)
        rows["sbfunc eager plain"] = _runner(*_stepper(cnn(), []), batch)
    else:
        P, f = sbfunc.policies, WIDTH * LENGTH // 4
        policies = {
            "uniform": lambda: P.random_subset(BAYES_KEEP),
            "bayesian": lambda: P.bayesian(BAYES_KEEP, num_features=f, num_classes=CLASSES),
            "bayesian draws=16": lambda: P.bayesian(
                BAYES_KEEP, num_features=f, num_classes=CLASSES, draws=16
            ),
        }
        for name in BAYES_ROWS:
            policy, mode = name.rsplit(" ", 1)
            torch.manual_seed(0)
            model = cnn()
            step, state = _stepper(model, [_sb(policies[policy]())], compiled=mode == "compiled")
            rows[name] = _runner(step, state, batch)
    for advance in rows.values():
        for _ in range(3):  # compile and warm up
            advance()
    return rows


def serve() -> None:
    """The worker's loop: one JSON command a line on stdin, one JSON answer a line on stdout."""
    import sbfunc

    rows: dict[str, Callable[[], None]] = {}
    reply = sys.stdout
    sys.stdout = sys.stderr  # anything the library prints stays off the protocol
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["do"] == "version":
            out: Any = {"version": sbfunc.__version__, "file": sbfunc.__file__}
        elif cmd["do"] == "ops":
            out = op_counts()
        elif cmd["do"] == "build":
            t0 = time.perf_counter()
            rows.update(build_rows(cmd["part"], cmd["threads"]))
            out = {"s": time.perf_counter() - t0}
        else:  # time: wall-clock and process CPU seconds per step
            advance, inner = rows[cmd["row"]], cmd["inner"]
            c0, t0 = time.process_time(), time.perf_counter()
            for _ in range(inner):
                advance()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            out = {"s": wall / inner, "cpu": cpu / inner}
        reply.write(json.dumps(out) + "\n")
        reply.flush()


# --- the parent: workers, interleaving, tables ----------------------------------------------


class Worker:
    """One build of sbfunc in a subprocess (``root`` first on its ``PYTHONPATH``)."""

    def __init__(self, label: str, root: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(root), "OMP_WAIT_POLICY": "PASSIVE"}
        self.label = label
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--serve"], env=env, cwd=HERE,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

    def ask(self, **cmd: Any) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.label} worker died (see its stderr above)")
        return json.loads(line)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def cell(values: list[float]) -> str:
    lo, med, hi = quartiles(values)
    return f"{med:.3f} [{lo:.3f}-{hi:.3f}]"


def us_cell(values: list[float]) -> str:
    lo, med, hi = quartiles([v * 1e6 for v in values])
    return f"{med:.0f} [{lo:.0f}-{hi:.0f}]"


def ratios(a: list[float], b: list[float]) -> list[float]:
    return [x / y for x, y in zip(a, b, strict=True)]


def print_ops(workers: list[Worker]) -> None:
    print("\n## Operator count per eager step (tiny MLP 16-32-4, batch 64, 1 thread)")
    print("| build | plain | hand SB | sbfunc SB | hand adds | sbfunc adds | sbfunc / hand "
          "added | target <= 2 |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for w in workers:
        c = w.ask(do="ops")
        hand, ours = c["hand SB"] - c["plain"], c["sbfunc SB"] - c["plain"]
        verdict = "MET" if ours <= 2 * hand else "MISSED"
        print(f"| {w.label} | {c['plain']} | {c['hand SB']} | {c['sbfunc SB']} | {hand} | "
              f"{ours} | {ours / hand:.2f} | {verdict} |")  # fmt: skip


Times = dict[tuple[str, str, str], list[float]]
"""Seconds per step by (build, row, clock), one value per round; clock: ``wall`` or ``cpu``."""


def timed(
    workers: list[Worker], part: str, rows: tuple[str, ...], rounds: int, inner: int
) -> Times:
    """Wall-clock and process CPU seconds per step of every (build, row), interleaved (every
    other round in reverse order)."""
    for w in workers:
        s = w.ask(do="build", part=part, threads=THREADS[0])["s"]
        print(f"  {w.label}: {part} rows built and warmed up in {s:.0f} s", flush=True)
    for w in workers:  # a short warm-up round, untimed
        for row in rows:
            w.ask(do="time", row=row, inner=1)
    t: Times = collections.defaultdict(list)
    pairs = [(w, row) for w in workers for row in rows]
    for r in range(rounds):
        for w, row in pairs if r % 2 == 0 else pairs[::-1]:  # A B C, C B A: no order bias
            got = w.ask(do="time", row=row, inner=inner)
            t[w.label, row, "wall"].append(got["s"])
            t[w.label, row, "cpu"].append(got["cpu"])
    return t


def ratio_cells(t: Times, a: tuple[str, str], b: tuple[str, str]) -> str:
    """``a / b`` per round, wall-clock then CPU time, as two table cells."""
    return " | ".join(cell(ratios(t[(*a, c)], t[(*b, c)])) for c in ("wall", "cpu"))


def print_cnn(workers: list[Worker], rounds: int, inner: int) -> None:
    t = timed(workers, "cnn", CNN_ROWS, rounds, inner)
    print(f"\n## Eager SB on the 1-D CNN (width {WIDTH}, batch {BATCH}, length {LENGTH}, keep "
          f"{KEEP}, {THREADS[0]} threads; {rounds} rounds x {inner} steps)")  # fmt: skip
    print("| build | hand eager SB us/step | sbfunc eager SB us/step | hand / sbfunc (speed "
          "share), wall | the same, CPU time | target >= 0.95 (wall) |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- |")
    for w in workers:
        hand, ours = (w.label, "hand eager SB"), (w.label, "sbfunc eager SB")
        share = quartiles(ratios(t[(*hand, "wall")], t[(*ours, "wall")]))[1]
        print(f"| {w.label} | {us_cell(t[(*hand, 'wall')])} | {us_cell(t[(*ours, 'wall')])} | "
              f"{ratio_cells(t, hand, ours)} | {_verdict(share >= 0.95)} |")  # fmt: skip
    if len(workers) == 2:
        for row in ("sbfunc eager SB", "sbfunc eager plain", "hand eager SB"):
            a, b = ((w.label, row) for w in workers)
            print(f"{row}, {workers[1].label} / {workers[0].label} (wall | CPU): "
                  f"{ratio_cells(t, b, a)}")  # fmt: skip


def print_bayes(workers: list[Worker], rounds: int, inner: int) -> None:
    t = timed(workers, "bayes", BAYES_ROWS, rounds, inner)
    print(f"\n## Bayesian selection on the 1-D CNN (keep {BAYES_KEEP}, batch {BATCH}, "
          f"{THREADS[0]} threads; {rounds} rounds x {inner} steps)")  # fmt: skip
    print("| build | row | us/step | vs uniform (same mode), wall | the same, CPU time | target |")
    print("| --- | --- | --- | --- | --- | --- |")
    for w in workers:
        for row in BAYES_ROWS:
            ref = (w.label, f"uniform {row.rsplit(' ', 1)[1]}")
            r = quartiles(ratios(t[w.label, row, "wall"], t[(*ref, "wall")]))[1]
            target = f"<= 1.3 {_verdict(r <= 1.3)}" if row == "bayesian eager" else ""
            print(f"| {w.label} | {row} | {us_cell(t[w.label, row, 'wall'])} | "
                  f"{ratio_cells(t, (w.label, row), ref)} | {target} |")  # fmt: skip
    if len(workers) == 2:
        for row in ("bayesian eager", "bayesian compiled"):
            a, b = ((w.label, row) for w in workers)
            r = quartiles(ratios(t[(*b, "wall")], t[(*a, "wall")]))[1]
            ok = "" if row.endswith("eager") else f"; target <= 1.1 {_verdict(r <= 1.1)}"
            print(f"{row}, {workers[1].label} / {workers[0].label} (wall | CPU): "
                  f"{ratio_cells(t, b, a)}{ok}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--baseline", type=Path, default=Path("/tmp/sbfunc10"), help="its checkout; none: skip"
    )
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--rounds", type=int, default=None, help="default 60 (quick: 3)")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2)")
    parser.add_argument("--quick", action="store_true", help="few rounds (a smoke run)")
    args = parser.parse_args()
    THREADS[0] = args.threads
    if args.serve:
        serve()
        return
    rounds = args.rounds or (3 if args.quick else 60)
    builds = [] if str(args.baseline) == "none" else [("baseline", args.baseline)]
    workers = [Worker(label, root) for label, root in [*builds, ("current", ROOT)]]
    try:
        for w in workers:
            v = w.ask(do="version")
            w.label = f"{w.label} {v['version']}"
            print(f"{w.label}: {v['file']}")
        if "ops" in args.parts:
            print_ops(workers)
        if "cnn" in args.parts:
            print_cnn(workers, rounds, 2 if args.quick else 4)
        if "bayes" in args.parts:
            print_bayes(workers, rounds, 1 if args.quick else 3)
    finally:
        for w in workers:
            w.close()


if __name__ == "__main__":
    main()
