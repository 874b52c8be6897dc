"""Interleaved timing shared by the benchmarks: A B C A B C ..., per-call seconds per round.

This module imports no torch: each timed script sets ``OMP_WAIT_POLICY=PASSIVE`` itself before
its first ``import torch`` (setting it here would come too late)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def interleaved(
    fns: dict[str, Callable[[], Any]], repeats: int, inner: int, *, warmup: int = 10
) -> dict[str, list[float]]:
    """Warm every function up, then time ``inner`` calls of each in turn, ``repeats`` rounds:
    machine noise spreads over every variant. Returns seconds per call, one per round."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            times[k].append((time.perf_counter() - t0) / inner)
    return times
