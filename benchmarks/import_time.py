"""``python -c "import sbfunc"`` against ``python -c "import torch"``: fresh interpreters,
interleaved (torch, sbfunc, torch, sbfunc, ...), medians with their quartiles, and the ratio:
of the medians, and the median of each round's own ratio (a round's two imports run under the
same load, so a busy machine's drift cancels).

Each run is a new process, as a user's first import is; the bytecode caches are warmed first
(one import of each, with ``PYTHONDONTWRITEBYTECODE`` unset), so both sides read ``.pyc``
files as an installed package does. The issue-35 target is sbfunc <= 1.2x torch.

    python benchmarks/import_time.py [--runs 5] [--sbfunc PATH_TO_ANOTHER_CHECKOUT]
        [--baseline PATH_TO_A_CHECKOUT_TO_COMPARE]

With ``--baseline``, a second sbfunc is imported in the same rounds (torch, sbfunc, baseline,
torch, ...), so a change's ratio and its parent's are measured under the same load.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import quartiles

ROOT = Path(__file__).resolve().parents[1]
CODE = {"torch": "import torch", "sbfunc": "import sbfunc"}


def _run(code: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, cwd=env["PYTHONPATH"], env=env)
    return time.perf_counter() - start


def _env(checkout: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    env["PYTHONPATH"] = str(checkout)
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="timed imports of each (default 5)")
    parser.add_argument(
        "--sbfunc", type=Path, default=ROOT, help="a checkout to import sbfunc from (default here)"
    )
    parser.add_argument(
        "--baseline", type=Path, default=None, help="another checkout, timed in the same rounds"
    )
    args = parser.parse_args()
    runs = {name: (code, _env(args.sbfunc)) for name, code in CODE.items()}
    if args.baseline is not None:
        runs["baseline"] = (CODE["sbfunc"], _env(args.baseline))
    for code, env in runs.values():  # warm the bytecode caches
        _run(code, env)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.runs):
        for name, (code, env) in runs.items():
            times[name].append(_run(code, env))
    print(f"{'import':<8} {'median s':>9} {'q1':>7} {'q3':>7}")
    for name, seconds in times.items():
        q1, med, q3 = quartiles(seconds)
        print(f"{name:<8} {med:9.3f} {q1:7.3f} {q3:7.3f}")
    for name in [n for n in runs if n != "torch"]:
        ratio = quartiles(times[name])[1] / quartiles(times["torch"])[1]
        rounds = zip(times[name], times["torch"], strict=True)
        q1, paired, q3 = quartiles([a / b for a, b in rounds])
        print(
            f"ratio {name} / torch: {ratio:.2f}x (medians), {paired:.2f}x [{q1:.2f}, {q3:.2f}] "
            "(median of each round's ratio, quartiles)  (target <= 1.2x)"
        )


if __name__ == "__main__":
    main()
