import subprocess
import sys
from pathlib import Path

import torch

import sbfunc
from tests.helpers import assert_identical
from tests.step import resume_job

ROOT = Path(__file__).resolve().parents[2]


def test_resume_in_a_fresh_process_is_bit_for_bit(tmp_path):
    total = resume_job.EPOCHS * resume_job.N // resume_job.BATCH
    uninterrupted = resume_job.run()
    assert uninterrupted.time.step == total
    assert uninterrupted.time.samples_backpropagated < uninterrupted.time.samples_forwarded
    sb_state, cutout_state, smoothing_state = uninterrupted.algorithm_state  # mirrors the list
    assert int(sb_state.pushed) > 0 and cutout_state is smoothing_state is None

    half = total // 2 + 1  # mid-epoch, while Selective Backprop is active
    first = resume_job.run(stop_after=half)
    assert first.time.step == half and first.time.batch_in_epoch > 0
    sbfunc.checkpoint.save(first, tmp_path / "half.pt")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.step.resume_job",
            str(tmp_path / "half.pt"),
            str(tmp_path / "final.pt"),
            str(torch.get_num_threads()),
        ],
        cwd=ROOT,
        check=True,
    )
    resumed = sbfunc.checkpoint.load(tmp_path / "final.pt", like=resume_job.template())
    assert_identical(resumed, uninterrupted)
