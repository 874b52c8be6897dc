"""The GPU record's runner (``gpu.py``): rows built in priority order under a time budget,
timed interleaved, measured for memory, rendered as markdown with verdicts.

A row that no longer fits what is left of the budget (its estimated build and compile time
plus its share of the timing) is not built: its cell says ``SKIPPED (budget)`` with the
estimate. Compiled rows estimate their compile time from the compile times measured earlier
in the run (``like``); a compile that runs past the budget's hard deadline is interrupted and
its row says ``ABORTED (budget)``. A row that raises says ``FAILED`` and the run goes on."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: see compiled_step.py

import torch
from _timing import device_sync, interleaved, paired, quartiles

Step = Callable[[], object]  # one training step on its own state and batch
Estimate = Callable[[dict[str, float]], float]  # seconds, from the compile seconds measured
MIN_ROUNDS = 3  # the fewest timed rounds


class Config(NamedTuple):
    device: torch.device
    quick: bool  # tiny models, few rounds: the CPU smoke run
    precision: str  # "amp_bf16" (the record's) or "fp32"
    backend: str  # torch.compile's


class Row(NamedTuple):
    name: str
    build: Callable[[], Step]
    estimate: Estimate  # seconds to build and warm up, from the compile seconds measured
    compiled: bool = False
    vs: tuple[tuple[str, str], ...] = ()  # (column, reference row): ratio columns


class Outcome(NamedTuple):
    times: list[float]  # seconds per step, one per round; empty when not timed
    note: str = ""  # the whole cell of a row not timed (SKIPPED, FAILED, ABORTED)
    compile_s: str = ""
    peak_mib: float | None = None  # one warm call's peak above what was allocated before
    held_mib: float | None = None  # allocated after the warm-up above before the build


class BudgetExceeded(BaseException):
    """Raised by the hard deadline's alarm inside a compile (BaseException: torch's
    ``except Exception`` fallbacks must not swallow it)."""


def fixed(seconds: float) -> Estimate:
    return lambda measured: seconds


def like(row: str, factor: float, otherwise: Estimate) -> Estimate:
    """``factor`` x the compile seconds measured for ``row``, or x ``row``'s own estimate
    (``otherwise``) while it has none."""
    return lambda measured: factor * (measured[row] if row in measured else otherwise(measured))


def failure(e: BaseException) -> str:
    text = str(e).strip()
    first = text.splitlines()[0] if text else ""
    return f"FAILED: {type(e).__name__}: {first}"[:160].replace("|", "/")


class Bound:
    """``advance(batch)`` as a zero-argument :data:`Step`, with the advance's ``settle``."""

    def __init__(self, advance: Callable[[Any], object], batch: Any) -> None:
        self.advance, self.batch = advance, batch

    def __call__(self) -> None:
        self.advance(self.batch)

    def settle(self) -> None:
        settle = getattr(self.advance, "settle", None)
        if settle is not None:
            settle()


@contextlib.contextmanager
def deadline(seconds: float | None) -> Iterator[None]:
    """Raise :class:`BudgetExceeded` in the main thread after ``seconds`` (None: never)."""
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def alarm(signum: int, frame: Any) -> None:
        raise BudgetExceeded

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Runner:
    """Builds, warms up and times groups of rows against one budget (``None``: no limit)."""

    def __init__(
        self, device: torch.device, budget_s: float | None, rounds: int, *,
        block_s: float, warmup: int, start: float, grace_s: float = 45.0, reserve_s: float = 5.0,
    ) -> None:  # fmt: skip
        self.device, self.budget_s, self.rounds = device, budget_s, rounds
        self.block_s, self.warmup, self.start, self.grace_s = block_s, warmup, start, grace_s
        self.reserve_s = reserve_s  # seconds kept for the end of the run
        self.sync = device_sync(device)
        self.compile_s: dict[str, float] = {}  # by row name, across the run
        self.skipped = 0
        self.peak_bytes = 0  # the run's peak CUDA memory, kept across peak_mib's resets

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return math.inf if self.budget_s is None else self.budget_s - self.elapsed()

    def fits(self, seconds: float) -> bool:
        return seconds + self.reserve_s <= self.left()

    def skip(self, estimate: float) -> Outcome:
        self.skipped += 1
        left = max(self.left(), 0.0)
        return Outcome([], f"SKIPPED (budget): est. {estimate:.0f} s, {left:.0f} s left")

    def memory(self) -> float | None:
        if self.device.type != "cuda":
            return None
        self.sync()
        return torch.cuda.memory_allocated(self.device) / 2**20

    def warm(self, row: Row) -> tuple[Step, list[float], str, float | None]:
        """Build ``row`` and call it ``warmup`` times (the compile): the step, each call's
        seconds, a note if inductor skipped CUDA graphs, the MiB it holds."""
        counters = torch._dynamo.utils.counters["inductor"]
        skips, before = counters["cudagraph_skips"], self.memory()
        hard = None if self.budget_s is None else self.left() + self.grace_s
        calls = []
        with deadline(hard if row.compiled else None):
            fn = row.build()
            for _ in range(self.warmup):
                self.sync()
                t0 = time.perf_counter()
                fn()
                self.sync()
                calls.append(time.perf_counter() - t0)
        getattr(fn, "settle", lambda: None)()
        after = self.memory()
        held = None if before is None or after is None else after - before
        note = " (CUDA graphs skipped)" if counters["cudagraph_skips"] > skips else ""
        return fn, calls, note, held

    def timing_cost(self, steps: list[float]) -> float:
        """Seconds to time steps of these durations: a warm-up call, the rounds, a peak call."""
        return sum(steps) * (self.inner(steps) * self.rounds + 2)

    def inner(self, steps: list[float]) -> int:
        """Steps per timed block: about ``block_s`` for the slowest row, 1 to 10."""
        slowest = max(steps, default=0.0)
        return max(1, min(10, round(self.block_s / slowest))) if slowest > 0 else 1

    def run(self, rows: list[Row]) -> tuple[dict[str, Outcome], int, int]:
        """Every row's outcome, and the rounds and steps per block they were timed with."""
        out: dict[str, Outcome] = {}
        fns: dict[str, Step] = {}
        step_s: dict[str, float] = {}
        notes: dict[str, tuple[str, float | None]] = {}
        for row in rows:
            guess = max(step_s.values(), default=0.0)
            est = row.estimate(self.compile_s)
            if not self.fits(est + self.timing_cost([*step_s.values(), guess])):
                out[row.name] = self.skip(est)
                continue
            try:
                fn, calls, note, held = self.warm(row)
            except BudgetExceeded:
                note = f"ABORTED (budget): still building at the deadline (est. {est:.0f} s)"
                out[row.name] = Outcome([], note)
                continue
            except Exception as e:
                out[row.name] = Outcome([], failure(e))
                continue
            fns[row.name], step_s[row.name] = fn, calls[-1]
            if row.compiled:
                self.compile_s[row.name] = max(0.0, sum(calls) - len(calls) * calls[-1])
                note = f"{self.compile_s[row.name]:.1f}{note}"
            notes[row.name] = (note, held)
        timed, rounds, inner = self.time(fns, step_s, notes)
        out |= timed
        return {r.name: out[r.name] for r in rows}, rounds, inner

    def rounds_for(self, step_s: dict[str, float], inner: int) -> int:
        per_round = inner * sum(step_s.values())
        if not per_round or self.budget_s is None:
            return self.rounds
        fit = int((self.left() - self.reserve_s) / per_round)
        return max(min(self.rounds, MIN_ROUNDS), min(self.rounds, fit))

    def time(
        self, fns: dict[str, Step], step_s: dict[str, float],
        notes: dict[str, tuple[str, float | None]],
    ) -> tuple[dict[str, Outcome], int, int]:  # fmt: skip
        """Time the built rows interleaved, then one warm call each for its peak memory: the
        outcomes, the rounds and the steps per block."""
        failed: dict[str, str] = {}
        guarded = {k: _guarded(fn, k, failed) for k, fn in fns.items()}
        settle = {k: getattr(fn, "settle", lambda: None) for k, fn in fns.items()}
        inner = self.inner(list(step_s.values()))
        rounds = self.rounds_for(step_s, inner)
        times = interleaved(guarded, rounds, inner, warmup=1, sync=self.sync, after=settle)
        out = {}
        for k in fns:
            peak = self.peak_mib(guarded[k])
            settle[k]()
            compile_s, held = notes[k]
            note = failed.get(k, "")
            out[k] = Outcome([] if note else times[k], note, compile_s, peak, held)
        return out, rounds, inner

    def peak_mib(self, fn: Step) -> float | None:
        """CUDA memory one call allocates above what was allocated before it (None off CUDA)."""
        if self.device.type != "cuda":
            return None
        self.sync()
        self.peak_bytes = max(self.peak_bytes, torch.cuda.max_memory_allocated(self.device))
        torch.cuda.reset_peak_memory_stats(self.device)
        base = torch.cuda.memory_allocated(self.device)
        fn()
        self.sync()
        return (torch.cuda.max_memory_allocated(self.device) - base) / 2**20


def _guarded(fn: Step, name: str, failed: dict[str, str]) -> Step:
    """``fn``, which records its first exception in ``failed`` and is a no-op after it."""

    def run() -> None:
        if name not in failed:
            try:
                fn()
            except Exception as e:
                failed[name] = failure(e)

    return run


def combined(outcomes: dict[str, Outcome], parts: list[str]) -> Outcome:
    """A row made of others run one after the other: per round, the sum of their times."""
    if any(not outcomes[p].times for p in parts):
        return Outcome([], "not measured: " + ", ".join(p for p in parts if not outcomes[p].times))
    return Outcome([sum(ts) for ts in zip(*(outcomes[p].times for p in parts), strict=True)])


def cell(values: list[float], fmt: str = "{:.2f}") -> str:
    lo, med, hi = quartiles(values)
    return f"{fmt.format(med)} [{fmt.format(lo)}-{fmt.format(hi)}]"


def table(
    title: str, rows: list[tuple[str, tuple[tuple[str, str], ...]]],
    outcomes: dict[str, Outcome], rounds: int, inner: int,
) -> list[str]:  # fmt: skip
    """A markdown table: ms per step, the ratio columns the rows name, memory, compile s."""
    columns = list(dict.fromkeys(c for _, vs in rows for c, _ in vs))
    head = ["row", "ms/step median [IQR]", *(f"{c} [IQR]" for c in columns), "peak MiB",
            "held MiB", "compile s"]  # fmt: skip
    steps = f"{inner} step" + "s" * (inner != 1)
    lines = [f"### {title}", "", f"{rounds} interleaved rounds x {steps} per row.", "",
             "| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]  # fmt: skip
    for name, vs in rows:
        o = outcomes[name]
        if not o.times:
            lines.append(f"| {name} | {o.note} |" + " |" * (len(head) - 2))
            continue
        refs = dict(vs)
        ratios = []
        for c in columns:
            ref = outcomes.get(refs.get(c, name))
            if refs.get(c, name) == name or ref is None or len(ref.times) != len(o.times):
                ratios.append("")
                continue
            ratios.append(cell([a / b for a, b in zip(o.times, ref.times, strict=True)], "{:.3f}"))
        mib = ["" if v is None else f"{v:.0f}" for v in (o.peak_mib, o.held_mib)]
        cells = [cell([t * 1e3 for t in o.times]), *ratios, *mib, o.compile_s]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def verdict(
    label: str, outcomes: dict[str, Outcome], num: str, den: str, limit: float, *,
    strict: bool = False,
) -> str:  # fmt: skip
    """``label: met/missed (median [IQR] of the per-round ratios num / den)``; the limit is
    ``<= limit`` (``strict``: ``< limit``); ``not measured`` when a row was not timed."""
    for name in (num, den):
        if not outcomes[name].times:
            return f"- {label}: **not measured** (`{name}`: {outcomes[name].note})"
    q1, med, q3 = paired(outcomes[num].times, outcomes[den].times)
    ok = med < limit if strict else med <= limit
    return f"- {label}: **{'met' if ok else 'missed'}** ({med:.3f} [{q1:.3f}-{q3:.3f}])"
