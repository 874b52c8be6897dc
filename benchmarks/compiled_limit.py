"""The compiled step at the hand-written limit (issue 37, item 3), before and after.

For each model it times, interleaved in one process (A B C A B C ..., the same batch, medians
and the interquartile range of the per-round ratios; compile time apart):

* ``hand plain``: the bare hand-written compiled step of ``_steps.hand_runner``
  (``functional_call`` + ``grad_and_value`` + Adam, ``fullgraph=True``, no guard);
* ``hand SB``: the hand-written compiled Selective Backprop step *with sbfunc's features*
  (``_hand_features``: keyed tie-breaking, non-finite ranking, counting unscorable rows, the
  non-finite guard), the fair limit of ``sbfunc SB``; ``hand guarded plain`` is its plain
  counterpart (the guard alone);
* ``sbfunc plain`` / ``sbfunc SB``: ``step.compile()`` with the default ``nonfinite="skip"``;
  ``.../allow``: ``nonfinite="allow"`` (the guard's compiled cost is ``skip / allow``);
* ``eager plain`` / ``eager plain/allow``: the eager sbfunc step (the guard's eager cost).

Models: ``cnn``, the study's 1-D CNN at width 32, batch 64 on ``[1, 40]`` inputs (2 threads);
``zero``, the zero-compute ``Flatten-Linear(8,8)-ReLU-Linear(8,2)`` at batch 8 (1 thread), as
``host_overhead.py`` builds them. Each (model, sbfunc version) runs in its own process; with
``--before DIR`` (a checkout of sbfunc 1.0, e.g. the worktree ``/tmp/sbfunc10``) the same rows
run against that sbfunc too (``PYTHONPATH=DIR``), alternating processes (``--processes``), so
every ratio is printed before and after.

Run: ``python benchmarks/compiled_limit.py --before /tmp/sbfunc10`` (``--models``,
``--rounds``, ``--processes``, ``--quick`` for a smoke run).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # a shared machine: see compiled_step.py

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from _timing import quartiles

HERE = Path(__file__).resolve().parent
# (hand row, sbfunc row, target): the ratio printed is sbfunc time / hand time
RATIOS = {
    "cnn": [("hand plain", "sbfunc plain", 1 / 0.95), ("hand plain", "sbfunc plain/allow", None),
            ("sbfunc plain/allow", "sbfunc plain", None),
            ("eager plain/allow", "eager plain", None)],
    "zero": [("hand plain", "sbfunc plain", 1.1), ("hand SB", "sbfunc SB", 1.25),
             ("hand guarded plain", "sbfunc plain", None),
             ("hand plain", "hand guarded plain", None),
             ("sbfunc plain/allow", "sbfunc plain", None), ("sbfunc SB/allow", "sbfunc SB", None),
             ("eager plain/allow", "eager plain", None)],
}  # fmt: skip
THREADS = {"cnn": 2, "zero": 1}


def build(model_name: str) -> tuple[dict[str, Callable[[], None]], dict[str, float]]:
    """The rows of ``model_name`` as zero-argument steps on one fixed batch, and each row's
    first call in seconds (for a compiled row: its compile)."""
    import torch
    from torch import nn

    sys.path[:0] = [str(HERE), str(HERE.parent / "examples")]
    import time_to_accuracy
    from _hand_features import guarded_runner
    from _steps import hand_runner, sbfunc_runner

    torch.manual_seed(0)
    if model_name == "cnn":
        model, shape, batch, classes = time_to_accuracy.make_model(32), (1, 40), 64, 10
    else:
        model = nn.Sequential(nn.Flatten(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
        shape, batch, classes = (1, 8), 8, 2
    data = (torch.randn(batch, *shape), torch.randint(0, classes, (batch,)))
    makers = {
        "hand plain": lambda: hand_runner(model, None, True, batch),
        "sbfunc plain": lambda: sbfunc_runner(model, "plain", classes, "compile()"),
        "sbfunc plain/allow": lambda: sbfunc_runner(model, "plain", classes, "compile()/allow"),
        "eager plain": lambda: sbfunc_runner(model, "plain", classes, "eager"),
        "eager plain/allow": lambda: _eager_allow(model, classes),
    }
    if model_name == "zero":
        makers |= {
            "hand guarded plain": lambda: guarded_runner(model, False, batch, True),
            "hand SB": lambda: guarded_runner(model, True, batch, True),
            "sbfunc SB": lambda: sbfunc_runner(model, "SB", classes, "compile()"),
            "sbfunc SB/allow": lambda: sbfunc_runner(model, "SB", classes, "compile()/allow"),
        }
    rows, compile_s = {}, {}
    for name, make in makers.items():
        advance = make()
        t0 = time.perf_counter()
        advance(data)
        compile_s[name] = time.perf_counter() - t0
        rows[name] = (lambda a: lambda: a(data))(advance)
    return rows, compile_s


def _eager_allow(model, classes: int) -> Callable:
    """An eager sbfunc plain step with ``nonfinite="allow"``."""
    import torch.nn.functional as F
    from _steps import LR

    import sbfunc

    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.adam(LR), nonfinite="allow")
    state = [step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))]

    def advance(batch) -> None:
        state[0] = step(state[0], batch)[0]

    return advance


def child(model_name: str, rounds: int, inner: int) -> None:
    """Time the rows of one model with this process's sbfunc; print them as JSON."""
    import torch
    from _timing import interleaved

    import sbfunc

    torch.set_num_threads(THREADS[model_name])
    rows, compile_s = build(model_name)
    times = interleaved(rows, rounds, inner)
    print(json.dumps({"sbfunc": sbfunc.__file__, "times": times, "compile_s": compile_s}))


def run_child(model_name: str, before: str | None, rounds: int, inner: int) -> dict:
    env = dict(os.environ)
    if before is not None:
        env["PYTHONPATH"] = before + os.pathsep + env.get("PYTHONPATH", "")
    args = [sys.executable, __file__, "--child", model_name, "--rounds", str(rounds)]
    out = subprocess.run([*args, "--inner", str(inner)], env=env, check=True,
                         capture_output=True, text=True).stdout  # fmt: skip
    return json.loads(out.strip().splitlines()[-1])


def report(model_name: str, results: dict[str, list[dict]]) -> None:
    """The rows' times and the ratios, one column per sbfunc version."""
    versions = list(results)
    times = {v: _pooled([r["times"] for r in rs]) for v, rs in results.items()}
    print(f"\n## {model_name} ({THREADS[model_name]} thread(s)); ms per step, median [IQR]")
    for v, rs in results.items():
        print(f"{v}: sbfunc from {rs[0]['sbfunc']}, {len(rs)} process(es)")
    print(f"{'row':22}" + "".join(f"{v:>28}" for v in versions))
    for row in times[versions[0]]:
        cells = "".join(_cell([t * 1e3 for t in times[v][row]], 2) for v in versions)
        compile_s = statistics.median(r["compile_s"][row] for r in results[versions[0]])
        print(f"{row:22}{cells}   first call {compile_s:.1f} s")
    print("\nratio (per-round, interleaved): time / reference time, median [IQR]")
    for ref, row, target in RATIOS[model_name]:
        cells = "".join(
            _cell([a / b for a, b in zip(times[v][row], times[v][ref], strict=True)], 3)
            for v in versions
        )
        goal = "" if target is None else f"   target <= {target:.3f}"
        print(f"{row + ' / ' + ref:44}{cells}{goal}")


def _pooled(runs: list[dict[str, list[float]]]) -> dict[str, list[float]]:
    return {row: [t for run in runs for t in run[row]] for row in runs[0]}


def _cell(values: list[float], digits: int) -> str:
    lo, mid, hi = quartiles(values)
    return f"{mid:>12.{digits}f} [{lo:.{digits}f}-{hi:.{digits}f}]".rjust(28)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(THREADS), default=["cnn", "zero"])
    parser.add_argument("--before", help="a checkout of sbfunc 1.0 to run beside this one")
    parser.add_argument("--rounds", type=int, help="rounds per process (default 30 cnn, 100 zero)")
    parser.add_argument("--processes", type=int, default=2, help="processes per version")
    parser.add_argument("--quick", action="store_true", help="few rounds, one process")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--inner", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.rounds, args.inner)
    for name in args.models:
        rounds = args.rounds or (3 if args.quick else 30 if name == "cnn" else 100)
        inner = 5 if name == "cnn" else 20
        versions = {"now": None} | ({} if args.before is None else {"1.0": args.before})
        results: dict[str, list[dict]] = {v: [] for v in versions}
        for _ in range(1 if args.quick else args.processes):
            for version, path in versions.items():  # alternate: now, 1.0, now, 1.0, ...
                results[version].append(run_child(name, path, rounds, inner))
        report(name, results)
    print("\nhand SB: the hand-written compiled SB step with sbfunc's features (_hand_features);"
          " sbfunc rows: step.compile(), nonfinite='skip' unless '/allow'; eager rows: the"
          " eager sbfunc step.")  # fmt: skip


if __name__ == "__main__":
    main()
