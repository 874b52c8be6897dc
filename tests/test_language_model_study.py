"""The language-model study (``benchmarks/language_model.py``): its smoke run writes the
report, and the arithmetic the verdicts rest on behaves."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _lm_report import crossing  # noqa: E402


def test_crossing_interpolates_between_evaluations():
    curve = [(0, 5.0), (10, 3.0), (20, 2.0)]
    assert crossing(curve, 3.0) == 10
    assert crossing(curve, 2.5) == 15.0
    assert crossing(curve, 1.9) is None


@pytest.mark.slow  # about 30 s on 2 shared cores
def test_the_quick_study_writes_its_report(tmp_path):
    args = ["--quick", "--out", str(tmp_path), "--cache", str(tmp_path / "cache")]
    proc = subprocess.run(
        [sys.executable, "benchmarks/language_model.py", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (tmp_path / "language_models.md").read_text()
    for heading in (
        "## Targets (issue 36)",
        "## Mixed stream",
        "## Clean stream",
        "## Step costs",
    ):
        assert heading in text
    assert (tmp_path / "language_models.png").stat().st_size > 0


def test_a_rerun_keeps_the_hand_written_notes(tmp_path):
    from _lm_report import NOTES, _notes

    md = tmp_path / "language_models.md"
    assert _notes(md) == ""
    md.write_text(f"# old tables\n\n{NOTES}\n\nWhat it means.\n")
    assert _notes(md) == f"\n{NOTES}\n\nWhat it means.\n"
