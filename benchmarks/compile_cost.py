"""What compiling a step costs and when it pays: cold compile seconds against steps saved.

On the quickstart's CNN (``examples/quickstart.py``: batch 256, MNIST-1D-shaped ``[256, 1,
40]`` inputs, Adam), for a plain step and a Selective Backprop step (``keep=0.5``; two graphs:
the selecting plan and the plain one outside SB's window), it measures:

* ``cold``: the seconds of the first call of each plan after ``step.compile()``, in a fresh
  process with an empty inductor cache (``TORCHINDUCTOR_CACHE_DIR`` set to a new folder);
* ``warm``: the same in a fresh process that reuses that cache folder (what a second run of
  the same script on the same machine pays);
* ``mega``: the same in a fresh process with an empty cache folder after
  ``torch.compiler.load_cache_artifacts`` of the bytes the cold process saved with
  ``torch.compiler.save_cache_artifacts`` (the portable "mega-cache", for another machine or
  container);
* the eager and the compiled step, timed interleaved in the cold process (medians with the
  min-max spread of the per-round values), and the steps after which compiling breaks even:
  ``compile seconds / (eager - compiled)``.

Every measurement runs in its own child process (one per variant and phase), so no cache of
one measurement warms another.

Run: ``python benchmarks/compile_cost.py`` (``--quick``: fewer timing rounds and no mega-cache
phase; ``--variants plain SB``; ``--threads``, default 2). The cold compiles dominate: a
``--quick`` run took 5 minutes on a quiet 2-core machine, a full one 14 minutes under load
(``docs/how-to/compile.md`` has the numbers).
"""

from __future__ import annotations

import os

# A shared machine: busy-waiting OpenMP threads stall whenever another process holds a core
# (see compiled_step.py); must be set before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import sbfunc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import interleaved
from compiled_step import quickstart_cnn

LR = 1e-3
TOTAL = 10**6  # total_steps of the timed states: elapsed stays where it is set
SELECTING, PLAIN_PLAN = 0.5, 0.0  # elapsed inside and before SB's window (start=0.1)


def build(variant: str) -> tuple[Any, Any, tuple[torch.Tensor, torch.Tensor]]:
    """``(make_step, state, batch)``: a factory of fresh steps of ``variant`` (same model)."""
    torch.manual_seed(0)
    model, shape, rows = quickstart_cnn()
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")

    def make_step() -> Any:
        algorithms = []
        if variant == "SB":
            algorithms = [sbfunc.SelectiveBackprop(start=0.1, end=1.0, keep=0.5, interrupt=0)]
        return sbfunc.make_train_step(loss_fn, sbfunc.optim.adam(LR), algorithms)

    state = make_step().init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))
    g = torch.Generator().manual_seed(1)
    batch = torch.randn(rows, *shape, generator=g), torch.randint(0, 10, (rows,), generator=g)
    return make_step, state, batch


def at(state: Any, elapsed: float) -> Any:
    """``state`` set to ``elapsed`` of a run of ``TOTAL`` steps."""
    return state.replace(time=state.time._replace(elapsed=elapsed, total_steps=TOTAL))


def first_calls(step: Any, state: Any, batch: Any, variant: str) -> list[float]:
    """Seconds of the first call of each plan of the compiled ``step`` (one graph each)."""
    plans = [SELECTING, PLAIN_PLAN] if variant == "SB" else [SELECTING]
    seconds = []
    for elapsed in plans:
        t0 = time.perf_counter()
        step(at(state, elapsed), batch)
        seconds.append(time.perf_counter() - t0)
    return seconds


def steady(make_step: Any, compiled: Any, state: Any, batch: Any, rounds: int, inner: int) -> Any:
    """Per-round seconds per step of the eager and the compiled step, interleaved."""
    eager = make_step()
    states = {"eager": at(state, SELECTING), "compiled": at(state, SELECTING)}

    def run(name: str, step: Any) -> Any:
        def advance() -> None:
            states[name] = step(states[name], batch)[0]

        return advance

    fns = {"eager": run("eager", eager), "compiled": run("compiled", compiled)}
    return interleaved(fns, rounds, inner, warmup=3)


def child(args: argparse.Namespace) -> None:
    """One measurement in this process; prints one JSON line."""
    torch.set_num_threads(args.threads)
    if args.phase == "mega":
        torch.compiler.load_cache_artifacts(Path(args.artifacts).read_bytes())
    make_step, state, batch = build(args.variant)
    step = make_step()
    step.compile()
    out: dict[str, Any] = {"first_calls": first_calls(step, state, batch, args.variant)}
    if args.phase == "cold":
        out["times"] = steady(make_step, step, state, batch, args.rounds, args.inner)
        saved = torch.compiler.save_cache_artifacts()
        if saved is not None:
            Path(args.artifacts).write_bytes(saved[0])
    print(json.dumps(out))


def spawn(args: argparse.Namespace, variant: str, phase: str, cache: Path) -> dict[str, Any]:
    """Run one child measurement with ``cache`` as its inductor cache folder."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    cmd = [sys.executable, __file__, "--child", "--variant", variant, "--phase", phase,
           "--threads", str(args.threads), "--rounds", str(args.rounds),
           "--inner", str(args.inner), "--artifacts", str(args.artifacts)]  # fmt: skip
    done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(args: argparse.Namespace, variant: str, work: Path) -> dict[str, Any]:
    """The cold, warm and (unless ``--quick``) mega-cache phases of ``variant``."""
    args.artifacts = work / f"{variant}.bin"
    cold = spawn(args, variant, "cold", work / f"{variant}-cache")
    result = {"cold": cold["first_calls"], "times": cold["times"]}
    result["warm"] = spawn(args, variant, "warm", work / f"{variant}-cache")["first_calls"]
    if not args.quick and args.artifacts.exists():
        mega = spawn(args, variant, "mega", work / f"{variant}-mega")
        result["mega"] = mega["first_calls"]
    return result


def report(variant: str, r: dict[str, Any]) -> None:
    """One row per variant: compile seconds, step times and the break-even step count."""
    t = r["times"]
    eager, compiled = statistics.median(t["eager"]), statistics.median(t["compiled"])
    cold = sum(r["cold"])  # the first calls, less nothing: a steady call is milliseconds
    saved = eager - compiled
    even = f"{cold / saved:,.0f}" if saved > 0 else "never"
    per_graph = " + ".join(f"{s:.1f}" for s in r["cold"])
    warm = sum(r["warm"])
    mega = f"{sum(r['mega']):.1f}" if "mega" in r else "-"
    print(
        f"{variant:7}{per_graph:>16}{warm:>8.1f}{mega:>8}"
        f"{eager * 1e3:>9.2f} [{min(t['eager']) * 1e3:.2f}-{max(t['eager']) * 1e3:.2f}]"
        f"{compiled * 1e3:>9.2f} [{min(t['compiled']) * 1e3:.2f}-{max(t['compiled']) * 1e3:.2f}]"
        f"{even:>12}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few rounds, no mega-cache phase")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--variants", nargs="+", choices=["plain", "SB"], default=["plain", "SB"])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", default="plain", help=argparse.SUPPRESS)
    parser.add_argument("--phase", default="cold", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--inner", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--artifacts", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    args.rounds = args.rounds or (5 if args.quick else 15)
    args.inner = args.inner or (5 if args.quick else 10)
    if args.child:
        return child(args)
    print(f"torch {torch.__version__}, {args.threads} threads, quickstart CNN (batch 256), "
          f"step.compile() (inductor), {args.rounds} rounds x {args.inner} steps")  # fmt: skip
    header = (
        f"{'variant':7}{'cold s/graph':>16}{'warm s':>8}{'mega s':>8}"
        f"{'eager ms [spread]':>22}{'compiled ms [spread]':>22}{'break-even':>12}"
    )
    with tempfile.TemporaryDirectory(prefix="sbfunc-compile-cost-") as folder:
        results = {v: measure(args, v, Path(folder)) for v in args.variants}
    print(header)
    print("-" * len(header))
    for variant, r in results.items():
        report(variant, r)
    print(
        "\ncold: first call of each plan's graph in a fresh process with an empty inductor cache"
        " (SB: selecting + plain plan); warm: the same with that cache on disk; mega: an empty"
        " cache after torch.compiler.load_cache_artifacts; break-even: steps after which the"
        " cold compile has paid for itself (cold s / (eager - compiled))."
    )


if __name__ == "__main__":
    main()
