"""A training job that checkpoints every few steps and can be killed at any point, for the
kill-and-resume test (the pattern docs/how-to/failures.md recommends):

    python -m tests.step.kill_resume_job FOLDER EVERY NUM_THREADS [SLOW_SAVE_AT]

resumes from ``FOLDER/last.pt`` when it exists (else starts fresh) and runs ``sbfunc.fit``
with ``Checkpointing(FOLDER/last.pt, every=Duration(steps=EVERY))``, printing ``saved <step>``
after each (atomic) save; at the end it saves ``FOLDER/final.pt`` and prints ``done``.
With ``SLOW_SAVE_AT`` the save of that step prints ``writing <step>`` once its temporary file
is written, then sleeps before the rename, so the test can kill it during the save.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import torch

import sbfunc
from tests.step import resume_job

TOTAL = resume_job.EPOCHS * resume_job.N // resume_job.BATCH


def train(folder: str, every: int, slow_save_at: int | None = None) -> sbfunc.TrainState:
    """Run (or resume from ``folder/last.pt``) the job to the end with ``fit``'s own
    checkpoints every ``every`` steps; print ``saved <step>`` after each save."""
    step, state, data = resume_job.build()
    last = os.path.join(folder, "last.pt")
    save = sbfunc.checkpoint.save

    def save_and_report(tree: sbfunc.TrainState, path: str) -> None:
        if tree.time.step == slow_save_at:
            _slow_save(save, tree, path)
        else:
            save(tree, path)
        print(f"saved {tree.time.step}", flush=True)

    sbfunc.checkpoint.save = save_and_report  # type: ignore[assignment]
    try:
        return sbfunc.fit(
            step,
            state,
            data,
            epochs=resume_job.EPOCHS,
            steps_per_epoch=resume_job.N // resume_job.BATCH,
            progress=False,
            history=False,
            checkpointing=sbfunc.step.Checkpointing(
                save_to=last,
                every=sbfunc.engine.Duration(steps=every),
                load_from=last if os.path.exists(last) else None,
            ),
        ).state
    finally:
        sbfunc.checkpoint.save = save  # type: ignore[assignment]


def _slow_save(save: Any, state: sbfunc.TrainState, path: str) -> None:
    """``save`` that stops between writing the temporary file and renaming it."""
    write = torch.save

    def write_then_wait(obj: object, f: Any) -> None:
        write(obj, f)
        f.flush()
        print(f"writing {state.time.step}", flush=True)
        time.sleep(60)  # killed here

    torch.save = write_then_wait  # type: ignore[assignment]
    try:
        save(state, path)
    finally:
        torch.save = write


if __name__ == "__main__":
    folder, every, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    slow = int(sys.argv[4]) if len(sys.argv) > 4 else None
    torch.set_num_threads(threads)
    final = train(folder, every, slow)
    sbfunc.checkpoint.save(final, os.path.join(folder, "final.pt"))
    print("done", flush=True)
