"""A training job that checkpoints every few steps and can be killed at any point, for the
kill-and-resume test (the pattern docs/how-to/failures.md recommends):

    python -m tests.step.kill_resume_job FOLDER EVERY NUM_THREADS [SLOW_SAVE_AT]

resumes from ``FOLDER/last.pt`` when it exists (else starts fresh), runs ``sbfunc.fit`` in
chunks of ``EVERY`` steps with ``stop_after``, saves ``FOLDER/last.pt`` atomically after each
chunk and prints ``saved <step>``; at the end it saves ``FOLDER/final.pt`` and prints ``done``.
With ``SLOW_SAVE_AT`` the save of that step prints ``writing <step>`` once its temporary file
is written, then sleeps before the rename, so the test can kill it during the save.
"""

from __future__ import annotations

import os
import sys
import time

import torch

import sbfunc
from tests.step import resume_job

TOTAL = resume_job.EPOCHS * resume_job.N // resume_job.BATCH


def train(folder: str, every: int, slow_save_at: int | None = None) -> sbfunc.TrainState:
    """Run (or resume) the job to the end, checkpointing every ``every`` steps."""
    step, state, data = resume_job.build()
    last = os.path.join(folder, "last.pt")
    if os.path.exists(last):
        state = sbfunc.checkpoint.load(last, like=state)
    while state.time.step < TOTAL:
        state = sbfunc.fit(
            step,
            state,
            data,
            epochs=resume_job.EPOCHS,
            steps_per_epoch=resume_job.N // resume_job.BATCH,
            progress=False,
            stop_after=min(state.time.step + every, TOTAL),
            history=False,
        ).state
        if state.time.step == slow_save_at:
            _slow_save(state, last)
        else:
            sbfunc.checkpoint.save(state, last)
        print(f"saved {state.time.step}", flush=True)
    return state


def _slow_save(state: sbfunc.TrainState, path: str) -> None:
    """``checkpoint.save`` that stops between writing the temporary file and renaming it."""
    write = torch.save

    def write_then_wait(obj: object, f: object) -> None:
        write(obj, f)
        f.flush()  # type: ignore[attr-defined]
        print(f"writing {state.time.step}", flush=True)
        time.sleep(60)  # killed here

    torch.save = write_then_wait
    try:
        sbfunc.checkpoint.save(state, path)
    finally:
        torch.save = write


if __name__ == "__main__":
    folder, every, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    slow = int(sys.argv[4]) if len(sys.argv) > 4 else None
    torch.set_num_threads(threads)
    final = train(folder, every, slow)
    sbfunc.checkpoint.save(final, os.path.join(folder, "final.pt"))
    print("done", flush=True)
