"""Saves a large state over existing checkpoints in forked workers, for the SIGKILL test:

    python -m tests.checkpoint_save_job PATH PAUSE_AT [PATH PAUSE_AT ...]

One worker per PATH (torch is imported once, then each worker is forked before any torch op):
it writes ``PATH.pid``, saves :func:`new_state` to ``PATH`` with ``sbfunc.checkpoint.save`` and
writes ``PATH.done``. With ``PAUSE_AT = n > 0`` the worker stops inside its n-th ``os.fsync``
call (1: the temporary file's, before the rename; 2: the folder's, after it), after writing
``PATH.paused``. The parent kills workers with SIGKILL; this process reaps them and prints
``PATH STATUS`` lines (the ``os.waitpid`` status).
"""

from __future__ import annotations

import os
import sys
import time

import torch

import sbfunc.checkpoint as ck

SIZE = 2_000_000


def new_state() -> dict:
    return {"w": torch.arange(SIZE, dtype=torch.float32), "step": 2}


def old_state() -> dict:
    return {"w": torch.zeros(SIZE), "step": 1}


def worker(path: str, pause_at: int) -> None:
    real_fsync, calls = os.fsync, []

    def fsync(fd: int) -> None:
        calls.append(fd)
        if len(calls) == pause_at:
            open(path + ".paused", "w").close()
            time.sleep(60)
        real_fsync(fd)

    os.fsync = fsync
    ck.save(new_state(), path)
    open(path + ".done", "w").close()


if __name__ == "__main__":
    jobs = list(zip(sys.argv[1::2], map(int, sys.argv[2::2]), strict=True))
    pids = []
    for path, pause_at in jobs:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                worker(path, pause_at)
                code = 0
            finally:
                os._exit(code)  # never back into the parent's loop
        with open(path + ".pid.tmp", "w") as f:
            f.write(str(pid))
        os.replace(path + ".pid.tmp", path + ".pid")
        pids.append(pid)
    for (path, _), pid in zip(jobs, pids, strict=True):
        print(path, os.waitpid(pid, 0)[1], flush=True)
