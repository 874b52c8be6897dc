"""``python -c "import sbfunc"`` against ``python -c "import torch"``: fresh interpreters,
interleaved (torch, sbfunc, torch, sbfunc, ...), medians with their quartiles, and the ratio.

Each run is a new process, as a user's first import is; the bytecode caches are warmed first
(one import of each, with ``PYTHONDONTWRITEBYTECODE`` unset), so both sides read ``.pyc``
files as an installed package does. The issue-35 target is sbfunc <= 1.2x torch.

    python benchmarks/import_time.py [--runs 5] [--sbfunc PATH_TO_ANOTHER_CHECKOUT]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="timed imports of each (default 5)")
    parser.add_argument(
        "--sbfunc", type=Path, default=ROOT, help="a checkout to import sbfunc from (default here)"
    )
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    env["PYTHONPATH"] = str(args.sbfunc)
    for code in CODE.values():  # warm the bytecode caches
        _run(code, env)
    times: dict[str, list[float]] = {name: [] for name in CODE}
    for _ in range(args.runs):
        for name, code in CODE.items():
            times[name].append(_run(code, env))
    print(f"{'import':<8} {'median s':>9} {'q1':>7} {'q3':>7}")
    for name, seconds in times.items():
        q1, med, q3 = quartiles(seconds)
        print(f"{name:<8} {med:9.3f} {q1:7.3f} {q3:7.3f}")
    ratio = quartiles(times["sbfunc"])[1] / quartiles(times["torch"])[1]
    print(f"ratio sbfunc / torch (medians): {ratio:.2f}x  (target <= 1.2x)")


if __name__ == "__main__":
    main()
