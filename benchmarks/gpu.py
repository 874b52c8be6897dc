"""One command for any CUDA machine: sbfunc's step against a torch.optim loop and a
hand-written compiled step, as markdown tables headed by the device's name.

For the quickstart CNN (batch 256) and a ResNet-18 (batch 128, 32x32 inputs), in ``fp32`` and
``amp_bf16`` (forward and loss under bf16 autocast), it times interleaved (one process, the
same batch, ``torch.cuda.synchronize`` around each timed block, never inside a step): the
``torch.optim loop``; the ``hand compiled`` step (``benchmarks/_steps.py``), plain and doing
SB's work by hand; ``sbfunc`` eager, ``compile()`` and ``compile(reduce-overhead)`` (CUDA
graphs), each ``plain``, ``SB`` (``SelectiveBackprop(keep=0.5)``) and ``SB+3`` (+ CutOut,
MixUp, LabelSmoothing); and SB's ideal, per mode: the ``score forward`` of the whole batch
plus a plain step on the ``k`` kept rows, against which the second table sets the SB step.
Columns: ms per step, median [IQR] over rounds; ``vs loop`` and ``vs hand compiled`` (the
same variant; SB+3 against hand SB): medians [IQR] of per-round ratios; ``peak MiB``: CUDA
memory one call allocates above what was held before it; ``compile s``: the warm-up calls
minus as many steady ones ("CUDA graphs skipped" when inductor says so). A row that raises is
``FAILED`` with the exception's first line and the run goes on. Last, per-sample gradients
and GGN factors against BackPACK and torch.func (``per_sample.py``'s and ``curvature.py``'s
contenders, on the device; BackPACK's rows left out when it is not installed).

Run: ``python benchmarks/gpu.py`` (``--out FILE``, ``--models``, ``--precisions``,
``--rounds``, ``--threads``, ``--backend``). ``--device cpu --quick`` is CI's smoke run
(``tests/test_benchmarks.py``): batches of 16 and 8, the ResNet at width 8 on 8x8 inputs, 3
rounds, the ideal eager only, and two compiled rows, hand-written and sbfunc ``compile()``,
plain, on the CNN in fp32, with ``backend="aot_eager"`` (traced, no code generated; tracing
the ResNet would take a minute on 2 cores). ``compile(reduce-overhead)`` is left out on a CPU.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: see compiled_step.py

import argparse
import functools
import platform
import statistics
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

import sbfunc

sys.path.insert(0, str(Path(__file__).resolve().parent))
import curvature
import per_sample
from _models import resnet18
from _steps import KEEP, PRECISIONS, Advance, hand_runner, loop_runner, sbfunc_runner, score_runner
from _timing import device_sync, interleaved, quartiles
from compiled_step import quickstart_cnn

VARIANTS = ("plain", "SB", "SB+3")
MODES = ("eager", "compile()", "compile(reduce-overhead)")
NO_PRECISION = "precision= not available"  # make_train_step without a precision argument
LOOP, HAND = "torch.optim loop", "hand compiled"
RUN_PEAK = [0]  # bytes: the run's peak CUDA memory, kept across peak_mib's resets


class Setup(NamedTuple):
    title: str
    build: Callable[[], nn.Module]
    shape: tuple[int, ...]  # one sample's input shape
    batch: int
    classes: int
    compiled_in_quick: bool = True  # --quick: its plain fp32 rows compiled (aot_eager)


class Config(NamedTuple):
    device: torch.device
    quick: bool
    rounds: int
    inner: int
    warmup: int
    backend: str


def setups(quick: bool) -> dict[str, Setup]:
    """The models by ``--models`` name; ``quick``: tiny batches, a ResNet of width 8 on 8x8."""
    cnn = Setup("quickstart CNN", lambda: quickstart_cnn()[0], (1, 40), 16 if quick else 256, 10)
    if quick:
        tiny = Setup("ResNet-18 (width 8)", lambda: resnet18(width=8), (3, 8, 8), 8, 10, False)
        return {"quickstart": cnn, "resnet18": tiny}
    return {"quickstart": cnn, "resnet18": Setup("ResNet-18", resnet18, (3, 32, 32), 128, 10)}


def failure(e: BaseException) -> str:
    """The FAILED cell: the exception's first line (a missing ``precision=`` said plainly)."""
    text = str(e).strip()
    if isinstance(e, TypeError) and "argument 'precision'" in text:
        return NO_PRECISION
    first = text.splitlines()[0] if text else ""
    return f"{type(e).__name__}: {first}"[:140].replace("|", "/")


def row_builders(s: Setup, precision: str, cfg: Config) -> dict[str, tuple[Callable, bool]]:
    """{row: (build(model) -> advance, on the kept rows?)}; ``--quick`` keeps the compiled
    rows to the plain ones in fp32 and the ideal to eager."""
    kw: dict[str, Any] = {"device": cfg.device, "precision": precision}
    ckw = {**kw, "backend": cfg.backend}
    compiled = not cfg.quick or (precision == "fp32" and s.compiled_in_quick)
    variants = ("plain",) if cfg.quick else VARIANTS
    modes = [m for m in MODES if cfg.device.type == "cuda" or "reduce" not in m]
    rows: dict[str, tuple[Callable, bool]] = {LOOP: (lambda m: loop_runner(m, **kw), False)}
    for v, select in (("plain", None), ("SB", "rank-power")):
        if compiled and v in variants:
            rows[f"{HAND} {v}"] = (
                lambda m, sel=select: hand_runner(m, sel, True, s.batch, **ckw),
                False,
            )
    for mode in modes:
        if mode == "eager" or compiled:
            for v in VARIANTS if mode == "eager" else variants:
                build = functools.partial(_sbfunc, v=v, classes=s.classes, mode=mode, kw=ckw)
                rows[f"sbfunc {mode} {v}"] = (build, False)
    k = max(1, int(KEEP * s.batch))
    for mode in ["eager"] if cfg.quick else modes:
        rows[f"score forward {mode}"] = (lambda m, mode=mode: score_runner(m, mode, **ckw), False)
        build = functools.partial(_sbfunc, v="plain", classes=s.classes, mode=mode, kw=ckw)
        rows[f"sbfunc {mode} plain, {k} rows"] = (build, True)
    return rows


def _sbfunc(model: nn.Module, *, v: str, classes: int, mode: str, kw: dict) -> Advance:
    return sbfunc_runner(model, v, classes, mode, **kw)


class Measured(NamedTuple):
    names: list[str]  # every row, in order
    times: dict[str, list[float]]  # seconds per step, one per round
    failed: dict[str, str]  # row: the FAILED cell
    compile_s: dict[str, str]  # seconds, and whether CUDA graphs were skipped
    peak: dict[str, float | None]


def measure(s: Setup, precision: str, cfg: Config) -> Measured:
    """Build, warm up (compile) and time every row; a row that raises is marked failed."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(s.batch, *s.shape, generator=gen).to(cfg.device)
    data = (x, torch.randint(0, s.classes, (s.batch,), generator=gen).to(cfg.device))
    k = max(1, int(KEEP * s.batch))
    kept = (data[0][:k], data[1][:k])
    fns: dict[str, Callable[[], None]] = {}
    failed: dict[str, str] = {}
    warm: dict[str, tuple[float, str]] = {}
    builders = row_builders(s, precision, cfg)
    for name, (build, on_kept) in builders.items():
        torch.manual_seed(0)  # the same initial weights for every row
        try:
            fn, seconds, note = warm_up(build, s.build, kept if on_kept else data, cfg)
        except Exception as e:
            failed[name] = failure(e)
            continue
        fns[name], warm[name] = guarded(fn, name, failed), (seconds, note)
    times = interleaved(fns, cfg.rounds, cfg.inner, warmup=1, sync=device_sync(cfg.device))
    compile_s = {
        n: f"{cfg.warmup * (warm[n][0] - statistics.median(times[n])):.1f}{warm[n][1]}"
        for n in fns
        if " compile" in n or n.startswith(HAND)
    }
    peak = {n: peak_mib(fn, cfg.device) for n, fn in fns.items()}
    return Measured(list(builders), times, failed, compile_s, peak)


def warm_up(
    build: Callable, model: Callable[[], nn.Module], batch: tuple, cfg: Config
) -> tuple[Callable[[], object], float, str]:
    """A row's step on its batch after its warm-up calls (the compile), the seconds per
    warm-up call, and a note if inductor skipped CUDA graphs while compiling it."""
    counters = torch._dynamo.utils.counters["inductor"]
    skips = counters["cudagraph_skips"]
    fn = functools.partial(build(model().to(cfg.device)), batch)
    per_call = interleaved({"": fn}, 1, cfg.warmup, warmup=0, sync=device_sync(cfg.device))[""][0]
    return fn, per_call, " (CUDA graphs skipped)" if counters["cudagraph_skips"] > skips else ""


def guarded(fn: Callable[[], object], name: str, failed: dict[str, str]) -> Callable[[], None]:
    """``fn``, which records its first exception in ``failed`` and is a no-op after it."""

    def run() -> None:
        if name not in failed:
            try:
                fn()
            except Exception as e:
                failed[name] = failure(e)

    return run


def peak_mib(fn: Callable[[], object], device: torch.device) -> float | None:
    """CUDA memory one call allocates above what was allocated before it (None off CUDA)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    RUN_PEAK[0] = max(RUN_PEAK[0], torch.cuda.max_memory_allocated())
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def cell(v: list[float], fmt: str = "{:.2f}") -> str:
    lo, med, hi = quartiles(v)
    return f"{fmt.format(med)} [{fmt.format(lo)}-{fmt.format(hi)}]"


def ratio(a: list[float], b: list[float]) -> list[float]:
    return [x / y for x, y in zip(a, b, strict=True)]


def hand_of(name: str) -> str | None:
    if not name.startswith(("sbfunc", LOOP)) or name.endswith(" rows"):
        return None
    return f"{HAND} plain" if name == LOOP or name.endswith("plain") else f"{HAND} SB"


def step_table(title: str, m: Measured) -> list[str]:
    head = "| row | ms/step median [IQR] | vs loop [IQR] | vs hand compiled [IQR] | peak MiB |"
    lines = [f"### {title}", "", head + " compile s |", "|---|---:|---:|---:|---:|---:|"]
    times, failed, compile_s, peak = m.times, m.failed, m.compile_s, m.peak
    for name in m.names:
        if name in failed:
            lines.append(f"| {name} | FAILED: {failed[name]} | | | | |")
            continue
        cells = [cell([t * 1e3 for t in times[name]])]
        part = name.startswith("score") or name.endswith(" rows")  # of the ideal
        for ref in ("" if part else LOOP, hand_of(name) or ""):
            ok = ref not in ("", name) and ref in times and ref not in failed
            cells.append(cell(ratio(times[name], times[ref])) if ok else "")
        cells.append("" if peak.get(name) is None else f"{peak[name]:.1f}")
        cells.append(compile_s.get(name, ""))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def ideal_table(m: Measured, k: int) -> list[str]:
    """SB's step against its ideal (scoring forward + plain step on the kept rows), per mode."""
    lines = [
        "| mode | SB / plain [IQR] | ideal / plain [IQR] | SB / ideal [IQR] |",
        "|---|---:|---:|---:|",
    ]
    for mode in MODES:
        parts = [
            f"sbfunc {mode} SB",
            f"sbfunc {mode} plain",
            f"score forward {mode}",
            f"sbfunc {mode} plain, {k} rows",
        ]
        if any(p not in m.times or p in m.failed for p in parts):
            continue
        sb, plain, score, kept = (m.times[p] for p in parts)
        ideal = [a + b for a, b in zip(score, kept, strict=True)]
        cells = [cell(ratio(sb, plain)), cell(ratio(ideal, plain)), cell(ratio(sb, ideal))]
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    return [*lines, ""] if len(lines) > 2 else []


def per_sample_tables(cfg: Config) -> list[str]:
    """Per-sample gradients and GGN factors: sbfunc against BackPACK and torch.func."""
    n = 16 if cfg.quick else 256
    torch.manual_seed(0)
    model = per_sample.cnn().to(cfg.device)
    x = torch.randn(n, 1, 28, 28).to(cfg.device)
    y = torch.randint(0, 10, (n,)).to(cfg.device)
    sub = list(range(0, n, 2))
    rows = {
        **per_sample.contenders(model, x, y, sub),
        **{f"GGN {k}": v for k, v in curvature.contenders(model, x, y, sub).items()},
    }
    lines = [
        f"### Per-sample gradients and curvature: MNIST CNN, N={n}, {len(sub)} kept, fp32",
        "",
        "| quantity | method | ms/call median [IQR] | vs sbfunc [IQR] | peak MiB |",
        "|---|---|---:|---:|---:|",
    ]
    for row, fns in rows.items():
        lines += method_rows(row, fns, cfg)
    if per_sample.backpack is None:
        lines.append(
            "\nBackPACK is not installed: its rows are left out "
            "(`pip install --no-deps backpack-for-pytorch==1.7.1 unfoldNd einops`)."
        )
    return [*lines, ""]


def method_rows(row: str, fns: dict[str, Callable[[], object]], cfg: Config) -> list[str]:
    """One quantity's methods, timed interleaved, each against sbfunc's."""
    failed: dict[str, str] = {}
    safe = {k: guarded(f, k, failed) for k, f in fns.items()}
    sync = device_sync(cfg.device)
    t = interleaved(safe, cfg.rounds, max(1, cfg.inner // 2), warmup=2, sync=sync)
    lines = []
    for method in fns:
        if method in failed:
            lines.append(f"| {row} | {method} | FAILED: {failed[method]} | | |")
            continue
        mine = method == "sbfunc" or "sbfunc" in failed
        vs = "" if mine else cell(ratio(t[method], t["sbfunc"]))
        mem = peak_mib(safe[method], cfg.device)
        ms = cell([s * 1e3 for s in t[method]])
        lines.append(f"| {row} | {method} | {ms} | {vs} | {'' if mem is None else f'{mem:.1f}'} |")
    return lines


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
        return next(ln.split(":", 1)[1].strip() for ln in cpuinfo if ln.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine() or "CPU"


def header(cfg: Config) -> list[str]:
    facts = [
        f"torch {torch.__version__}",
        f"sbfunc {sbfunc.__version__}",
        f"{torch.get_num_threads()} CPU threads",
    ]
    if cfg.device.type == "cuda":
        facts[1:1] = [f"CUDA {torch.version.cuda}", f"cuDNN {torch.backends.cudnn.version()}"]
        facts.append(f"cudnn.benchmark on, fp32 matmul {torch.get_float32_matmul_precision()}")
    facts.append(f"BackPACK {'absent' if per_sample.backpack is None else 'present'}")
    lines = [
        f"## GPU benchmark: {device_name(cfg.device)} ({cfg.device.type})",
        "",
        ", ".join(facts) + ".",
        "",
        f"{cfg.rounds} interleaved rounds x {cfg.inner} steps after {cfg.warmup} warm-up "
        f"calls per row; compiled rows: backend `{cfg.backend}`; keep {KEEP}.",
    ]
    if cfg.device.type != "cuda":
        lines.append("`compile(reduce-overhead)` (CUDA graphs) needs CUDA: left out here.")
    if cfg.quick:
        lines.append("`--quick`: compiled rows only plain, on the CNN in fp32; the ideal eager.")
    return [*lines, ""]


def parse() -> tuple[argparse.Namespace, Config]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="tiny models, few rounds (smoke run)")
    names = list(setups(False))
    p.add_argument("--models", nargs="+", choices=names, default=names)
    p.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    p.add_argument("--rounds", type=int, default=None, help="default 15 (--quick: 3)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--backend", default=None, help="inductor (--quick: aot_eager)")
    p.add_argument("--no-per-sample", action="store_true", help="skip the BackPACK tables")
    p.add_argument("--out", type=Path, default=None, help="also write the tables here")
    a = p.parse_args()
    device = torch.device(a.device)
    if device.type not in ("cpu", "cuda"):
        p.error(f"--device must be cpu or cuda, got {a.device!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda, but torch.cuda.is_available() is False")
    for flag in ("rounds", "threads"):
        if getattr(a, flag) is not None and getattr(a, flag) < 1:
            p.error(f"--{flag} must be >= 1, got {getattr(a, flag)}")
    rounds = a.rounds or (3 if a.quick else 15)
    inner, warmup = (1, 2) if a.quick else (10, 5)
    backend = a.backend or ("aot_eager" if a.quick else "inductor")
    return a, Config(device, a.quick, rounds, inner, warmup, backend)


def main() -> None:
    args, cfg = parse()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.backends.cudnn.benchmark = True
    torch._dynamo.config.recompile_limit = 64  # many steps compiled in one process
    warnings.filterwarnings("ignore", "Full backward hook is firing")  # BackPACK's hooks
    out = header(cfg)
    print("\n".join(out), flush=True)
    for s in (setups(cfg.quick)[name] for name in args.models):
        for precision in args.precisions:
            m = measure(s, precision, cfg)
            title = f"{s.title}, batch {s.batch}, input {list(s.shape)}, {precision}"
            lines = step_table(title, m) + ideal_table(m, max(1, int(KEEP * s.batch)))
            print("\n".join(lines), flush=True)
            out += lines
    if not args.no_per_sample:
        lines = per_sample_tables(cfg)
        print("\n".join(lines), flush=True)
        out += lines
    if cfg.device.type == "cuda":
        peak_gib = max(RUN_PEAK[0], torch.cuda.max_memory_allocated()) / 2**30
        out.append(f"Peak CUDA memory allocated over the whole run: {peak_gib:.2f} GiB.")
        print(out[-1])
    if args.out is not None:
        args.out.write_text("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
