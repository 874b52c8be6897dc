"""Interleaved timing shared by the benchmarks: A B C A B C ..., per-call seconds per round.

This module imports no torch: each timed script sets ``OMP_WAIT_POLICY=PASSIVE`` itself before
its first ``import torch`` (setting it here would come too late)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any


def _no_sync() -> None:
    return None


def device_sync(device: Any) -> Callable[[], Any]:
    """What ``interleaved`` should call around each block on ``device`` (a ``torch.device`` or
    its name): ``torch.cuda.synchronize`` on CUDA, else nothing (torch imported only then)."""
    if str(device).split(":")[0] != "cuda":
        return _no_sync
    import torch

    return torch.cuda.synchronize


def interleaved(
    fns: dict[str, Callable[[], Any]],
    repeats: int,
    inner: int,
    *,
    warmup: int = 10,
    sync: Callable[[], Any] = _no_sync,
    after: Mapping[str, Callable[[], Any]] | None = None,
) -> dict[str, list[float]]:
    """Warm every function up, then time ``inner`` calls of each in turn, ``repeats`` rounds:
    machine noise spreads over every variant. Returns seconds per call, one per round.

    ``sync`` runs before each timed block starts and before it ends (on CUDA,
    ``torch.cuda.synchronize``: a block times the work it launched, not its launches); only
    here, never inside the functions timed. ``after[k]``, where given, runs after each of
    ``k``'s warm-ups and timed blocks, outside the timing (a CUDA-graph step moves its state
    out of the graphs' shared memory pool there, before another function's graphs reuse it)."""
    settle = dict(after or {})
    for k, fn in fns.items():
        for _ in range(warmup):
            fn()
        settle.get(k, _no_sync)()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            sync()
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            sync()
            times[k].append((time.perf_counter() - t0) / inner)
            settle.get(k, _no_sync)()
    return times


def quartiles(v: list[float]) -> tuple[float, float, float]:
    """First quartile, median and third quartile (all three the value itself for one)."""
    q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3
    return q[0], statistics.median(v), q[2]


def paired(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """Quartiles of the per-round ratios ``a / b`` (two rows timed in the same rounds)."""
    return quartiles([x / y for x, y in zip(a, b, strict=True)])
