"""Kill a checkpointing training job with SIGKILL (between saves and during a save), resume it
from its last checkpoint in a fresh process, and get the uninterrupted run's state bit for
bit."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import sbfunc
from tests.helpers import assert_identical
from tests.step import kill_resume_job, resume_job

ROOT = Path(__file__).resolve().parents[2]
EVERY = 4


def _start(folder: Path, slow_save_at: int | None = None) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "tests.step.kill_resume_job", str(folder), str(EVERY)]
    args.append(str(torch.get_num_threads()))
    if slow_save_at is not None:
        args.append(str(slow_save_at))
    return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, text=True)


def _wait_for(job: subprocess.Popen[str], line: str) -> None:
    assert job.stdout is not None
    for got in job.stdout:
        if got.strip() == line:
            return
    raise AssertionError(f"the job ended (rc {job.wait()}) before printing {line!r}")


def _kill(job: subprocess.Popen[str]) -> None:
    job.send_signal(signal.SIGKILL)
    assert job.wait(timeout=30) == -signal.SIGKILL
    assert job.stdout is not None
    job.stdout.close()


def _last_step(folder: Path) -> int:
    state = sbfunc.checkpoint.load(folder / "last.pt", like=resume_job.template())
    return state.time.step


def test_a_job_killed_anywhere_resumes_to_the_uninterrupted_state(tmp_path):
    with tempfile.TemporaryDirectory() as reference_dir:  # the same chunked loop, not killed
        uninterrupted = kill_resume_job.train(reference_dir, EVERY)
    assert uninterrupted.time.step == kill_resume_job.TOTAL

    # 1. killed during the save of step 8: the temporary file is written, not renamed
    job = _start(tmp_path, slow_save_at=2 * EVERY)
    _wait_for(job, f"writing {2 * EVERY}")
    assert glob.glob(str(tmp_path / ".last.pt.*.tmp"))
    _kill(job)
    assert _last_step(tmp_path) == EVERY  # the previous checkpoint, intact

    # 2. resumed from step 4, killed between saves (right after saving step 12)
    job = _start(tmp_path)
    _wait_for(job, f"saved {3 * EVERY}")
    _kill(job)
    assert _last_step(tmp_path) >= 3 * EVERY

    # 3. resumed again, to the end
    job = _start(tmp_path)
    _wait_for(job, "done")
    assert job.wait(timeout=60) == 0
    assert job.stdout is not None
    job.stdout.close()
    resumed = sbfunc.checkpoint.load(tmp_path / "final.pt", like=resume_job.template())
    assert_identical(resumed, uninterrupted)
    # a killed save leaves its temporary file behind, never a broken last.pt
    leftovers = glob.glob(str(tmp_path / ".last.pt.*.tmp"))
    assert len(leftovers) <= 1 and os.path.getsize(tmp_path / "last.pt") > 0
