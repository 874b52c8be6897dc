"""sbfunc.checkpoint.save to a path is atomic: a failed or killed save keeps a loadable file."""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from sbfunc import checkpoint
from tests.helpers import assert_identical
from tests.test_checkpoint import STATE

ROOT = Path(__file__).resolve().parents[1]


def test_a_failed_save_leaves_the_old_checkpoint_and_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "state.pt"
    checkpoint.save(STATE, path)
    old = path.read_bytes()

    def dies_half_way(obj, f):
        f.write(b"PK\x03\x04 partial")
        raise RuntimeError("disk full")

    def interrupted(*args):
        raise KeyboardInterrupt

    for module, name, failure in [
        (torch, "save", dies_half_way),
        (os, "fsync", interrupted),
        (os, "replace", interrupted),
    ]:
        with monkeypatch.context() as m:
            m.setattr(module, name, failure)
            with pytest.raises((RuntimeError, KeyboardInterrupt)):
                checkpoint.save({**STATE, "step": 6}, path)
        assert path.read_bytes() == old and os.listdir(tmp_path) == ["state.pt"]
    checkpoint.save({**STATE, "step": 6}, path)
    assert checkpoint.load(path, like=STATE)["step"] == 6 and os.listdir(tmp_path) == ["state.pt"]


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions and symlinks")
def test_a_save_keeps_the_file_mode_and_writes_through_a_symlink(tmp_path):
    real, link = tmp_path / "real.pt", tmp_path / "latest.pt"
    checkpoint.save(STATE, real)
    real.chmod(0o600)
    link.symlink_to(real)
    checkpoint.save({**STATE, "step": 7}, link)
    assert link.is_symlink() and (real.stat().st_mode & 0o777) == 0o600
    assert checkpoint.load(real, like=STATE)["step"] == 7


def temp_size(folder):
    """The size of the save's temporary file in ``folder``, or -1 while there is none."""
    for tmp in folder.glob(".state.pt.*.tmp"):
        with contextlib.suppress(FileNotFoundError):  # renamed meanwhile
            return tmp.stat().st_size
    return -1


@pytest.mark.skipif(os.name != "posix", reason="os.fork and SIGKILL")
def test_a_killed_save_leaves_the_old_or_the_new_checkpoint_never_a_broken_one(tmp_path):
    from tests import checkpoint_save_job as job

    # Kill each worker at one moment: once its temporary file exists, once it holds some bytes
    # (mid-write), inside the file's fsync (before the rename), inside the folder's (after it).
    pause_at = [0, 0, 1, 2]
    ready = [
        lambda p: temp_size(p.parent) >= 0,
        lambda p: temp_size(p.parent) > 0,
        lambda p: p.with_name("state.pt.paused").exists(),
        lambda p: p.with_name("state.pt.paused").exists(),
    ]
    old = tmp_path / "old.pt"
    checkpoint.save(job.old_state(), old)
    paths = [tmp_path / str(n) / "state.pt" for n in range(len(pause_at))]
    for path in paths:
        path.parent.mkdir()
        shutil.copy(old, path)
    args = [str(a) for path, n in zip(paths, pause_at, strict=True) for a in (path, n)]
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.checkpoint_save_job", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    pending, deadline = set(range(len(paths))), time.monotonic() + 120
    while pending:
        assert time.monotonic() < deadline and server.poll() is None, "the workers got stuck"
        for n in list(pending):
            path = paths[n]
            pid_file = path.with_name("state.pt.pid")
            if path.with_name("state.pt.done").exists():
                pending.discard(n)  # saved before its moment was seen: checked below too
            elif pid_file.exists() and ready[n](path):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
                pending.discard(n)
        time.sleep(0.0002)
    out, _ = server.communicate(timeout=60)
    statuses = [int(line.split()[-1]) for line in out.splitlines()]
    assert all(s == 0 or os.WTERMSIG(s) == signal.SIGKILL for s in statuses), statuses
    outcomes = []
    for path in paths:
        back = checkpoint.load(path, like=job.old_state())
        assert_identical(back, job.old_state() if back["step"] == 1 else job.new_state())
        outcomes.append(back["step"])
    assert outcomes[2:] == [1, 2]  # killed before the rename: the old state; after it: the new
