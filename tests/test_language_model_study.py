"""The language-model study (``benchmarks/language_model.py``): its smoke run writes the
report, and the arithmetic the verdicts rest on behaves."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

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
        "## Issue 40's rows against the same targets",
        "## References",
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


def test_the_keep_schedule_rises_from_keep_to_every_token():
    from _lm_data import Config
    from _lm_methods import rising_keep

    cfg = Config()
    assert rising_keep(cfg, 0.0) == cfg.keep
    assert rising_keep(cfg, 1.0) == 1.0
    inside_a_step = rising_keep(cfg, torch.tensor(0.5))  # a 0-d tensor in the step
    assert torch.is_tensor(inside_a_step) and float(inside_a_step) == pytest.approx(0.8)


def test_each_method_is_charged_its_own_reference():
    from _lm_data import Config
    from _lm_methods import charges

    cfg = Config()
    assert charges(cfg, "plain", 500) == []
    assert charges(cfg, "selective LM", 500) == [("reference training step", 300)]
    assert charges(cfg, "selective LM, same-size reference, 4x text", 500) == [
        ("same-size reference training step", 1200)
    ]
    assert charges(cfg, "RHO-LOSS sequences, same-size reference", 500) == [
        ("same-size reference training step", 300),
        ("same-size reference forward (table)", 500),
    ]


def test_the_extra_reference_text_is_outside_the_corpus():
    """The 4x reference's extra rows come from files the study never reads: none of their
    text is a row of the streams or the held-out files."""
    from _lm_data import corpus, outside_rows

    cfg = __import__("language_model").QUICK
    extra = outside_rows(cfg, 200)
    ours = corpus(cfg.seq_len, cfg.max_bytes).rows["input_ids"]
    assert extra["input_ids"].shape == (200, cfg.seq_len)
    assert (extra["attention_mask"].sum(1) >= 2).all()
    assert not {tuple(r) for r in extra["input_ids"].tolist()} & {tuple(r) for r in ours.tolist()}
