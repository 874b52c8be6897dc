"""Every script in ``examples/`` runs to completion in its fast mode.

Each runs in a fresh interpreter (``python examples/NAME.py --fast``), from a temporary
working directory so that plots and checkpoints land there, with a non-interactive
matplotlib backend and a time limit.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
TIMEOUT_S = 300  # the fast modes take seconds; this only stops a hung run
# what a script's report must print, beyond exiting cleanly
PRINTS = {
    "quickstart.py": (
        "regime: MNIST-1D",
        "time to plain's final accuracy",
        "whole run, selective / plain wall time",
        "Where selection does not help",
    ),
    "language_model.py": (
        "mixed stream: held-out loss",
        "clean stream: held-out loss",
        "selective LM kept",
        "where it does not help",
    ),
}


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_example_runs_fast(script, tmp_path):
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    # TMPDIR: a plot written to a unique temporary file lands in the test's folder
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": path, "TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, str(script), "--fast"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, (
        f"{script.name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    for line in PRINTS.get(script.name, ()):
        assert line in proc.stdout, f"{script.name} did not print {line!r}:\n{proc.stdout}"


def test_there_are_examples():
    assert len(EXAMPLES) >= 2
