"""The GPU record: sbfunc's training step against hand-written loops on one CUDA device,
written to ``docs/results/gpu.md`` headed by the device's name.

What it measures, in priority order (``_gpu_lm.py``, ``_gpu_resnet.py``, ``_gpu_sync.py``):

1. the language model, eager: a GPT-2-small-sized ``CausalLM``, 16 x 1024 tokens; the hand
   loop (``torch.optim.AdamW(fused=True)``, Hugging Face's loss), sbfunc plain, and
   ``TokenSelection(0.6)`` by ``"uniform"`` and by ``"excess"`` over a same-size reference;
2. ResNet-18 (32x32, 10 classes), eager, at batch 256 then 1024: the ``torch.optim`` loop,
   SB written by hand around it, sbfunc plain and SB (``keep=0.5``), SB's ideal (sbfunc's
   scoring forward + the loop's step on the kept rows);
3. the sync row: each selection rule's warm eager step under
   ``torch.cuda.set_sync_debug_mode("error")``, ``sync-free`` or the first sync's site;
4. the language model compiled: the hand loop's forward and loss ``torch.compile``\\ d, then
   sbfunc's ``step.compile()`` and ``step.compile(mode="reduce-overhead")``, plain, uniform,
   excess, in that order;
5. ResNet-18 compiled (CUDA): the hand step with SB's work, sbfunc ``compile()`` plain, SB.

On CUDA everything runs under bf16 autocast (``--precision``; fp32 by default on a CPU,
whose bf16 convolutions are emulated without bf16 hardware: seconds per step). Timing:
interleaved rounds (A B C A B C ..., one process, one batch per model),
``torch.cuda.synchronize`` around each timed block only; ms per step median [IQR]; each
ratio is the median [IQR] of the per-round ratios. ``peak MiB``:
``torch.cuda.max_memory_allocated`` over one warm call, above what was allocated before it;
``held MiB``: what the row keeps allocated after its warm-up (its model copy, optimizer
state, CUDA graph pools). ``compile s``: the warm-up calls minus as many steady ones, from a
cold inductor cache (a fresh ``TORCHINDUCTOR_CACHE_DIR`` per run unless one is set). A
reduce-overhead row compiles right after its ``compile()`` sibling, from the same cache: it
reuses the sibling's Triton kernels and autotuning, not its graphs (the FX graph cache's key
includes ``triton.cudagraphs``). A CUDA-graph step's state lives in the graphs' shared memory
pool, which the next graph overwrites: between its timed blocks, outside the timing, the
row clones its state out (``_steps.GraphStep``).

Budget: compile time dominates (30 to over 120 s per compiled LM row), so the run keeps to
``--budget-s`` (290 s: a default run ends within 5 minutes). Rows are built in the order
above; a row whose estimated build (compiled rows: scaled from the compile times measured
earlier in the run) and timing no longer fits what is left is not built and reads
``SKIPPED (budget)`` with its estimate; a compile still running 45 s past the budget is
interrupted (``ABORTED (budget)``); a row that raises reads ``FAILED`` and the run goes on.
``--full``: no budget, every row. Each table is printed when measured and the page rewritten
after each, so a run stopped early keeps its tables. The verdicts of the targets (eager
sbfunc plain LM <= 1.05x the hand loop; ``TokenSelection`` uniform <= 1.03x plain; ResNet-18
SB below plain at batch 256) follow their tables and close the page.

Run: ``python benchmarks/gpu.py`` on the default CUDA device writes ``docs/results/gpu.md``
(``--out FILE`` elsewhere; ``--phases``, ``--budget-s``, ``--full``, ``--rounds``).
``--device cpu --quick --out FILE`` is CI's smoke run (``tests/test_benchmarks.py``): a tiny
LM and ResNet, 3 rounds, ``backend="aot_eager"`` for the two compiled rows (the hand loop and
``compile()`` plain), the sync row's steps run but not checked; it writes only to ``--out``.

Run on a GPU machine without network access whose Python has torch but not optree: first,
where pip works, in the repository's root (``.whl`` kept out of git)::

    echo /.whl/ >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \\
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \\
        --platform manylinux2014_x86_64 -d .whl optree==0.20.0

then, on the GPU machine, with ``.whl`` copied along (about 6 minutes in all)::

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \\
        PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD python3 benchmarks/gpu.py

and commit the ``docs/results/gpu.md`` it writes.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: see compiled_step.py

import argparse
import datetime
import functools
import gc
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

import sbfunc

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _gpu_lm
import _gpu_resnet
import _gpu_sync
from _gpu_budget import Config, Runner
from _steps import PRECISIONS

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "results" / "gpu.md"
PHASES = ("lm", "resnet", "sync", "lm-compiled", "resnet-compiled")
Phase = Callable[[Config, Runner], tuple[list[str], list[str]]]


def phases(cfg: Config, names: list[str]) -> list[tuple[str, Phase]]:
    """The tables to measure, in priority order."""
    batches = _gpu_resnet.sizes(cfg).batches
    found: list[tuple[str, Phase]] = [("lm", _gpu_lm.run_eager)]
    found += [("resnet", functools.partial(_gpu_resnet.run_eager, batch=b)) for b in batches]
    found += [("sync", _gpu_sync.run), ("lm-compiled", _gpu_lm.run_compiled)]
    if cfg.device.type == "cuda":
        run = _gpu_resnet.run_compiled
        found += [("resnet-compiled", functools.partial(run, batch=b)) for b in batches]
    return [(name, phase) for name, phase in found if name in names]


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
        return next(ln.split(":", 1)[1].strip() for ln in cpuinfo if ln.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine() or "CPU"


def command(argv: list[str]) -> str:
    """The command line that made the page, ``--out`` left out."""
    kept, skip = [], False
    for arg in argv:
        if skip or arg == "--out" or arg.startswith("--out="):
            skip = arg == "--out"
            continue
        kept.append(arg)
    return " ".join(["python benchmarks/gpu.py", *kept])


def header(cfg: Config, args: argparse.Namespace) -> list[str]:
    facts = [f"torch {torch.__version__}", f"sbfunc {sbfunc.__version__}",
             f"Python {platform.python_version()}"]  # fmt: skip
    if cfg.device.type == "cuda":
        facts[1:1] = [f"CUDA {torch.version.cuda}", f"cuDNN {torch.backends.cudnn.version()}"]
    budget = "none (`--full`)" if args.full else f"{args.budget_s:.0f} s"
    title = "# GPU record" + ("" if cfg.device.type == "cuda" else ": CPU smoke run, not a record")
    return [
        title,
        "",
        f"**{device_name(cfg.device)}** ({cfg.device.type}); {', '.join(facts)}; "
        f"{datetime.date.today().isoformat()}.",
        "",
        f"Command: `{command(sys.argv[1:])}`. Budget: {budget}. Precision `{cfg.precision}`"
        f"{' (the forward and loss under bf16 autocast)' if cfg.precision != 'fp32' else ''}; "
        f"compiled rows: backend `{cfg.backend}`"
        f"{'; `cudnn.benchmark` on' if cfg.device.type == 'cuda' else ''}. How each column is "
        "measured: the docstring of `benchmarks/gpu.py`.",
        "",
    ]


def footer(cfg: Config, runner: Runner, verdicts: list[str]) -> list[str]:
    lines = ["## Targets", "", *verdicts, ""]
    took = f"The run took {runner.elapsed():.0f} s"
    if runner.skipped:
        took += f"; {runner.skipped} rows did not fit the budget (`--full` runs them)"
    lines.append(took + ".")
    if cfg.device.type == "cuda":
        peak = max(runner.peak_bytes, torch.cuda.max_memory_allocated(cfg.device)) / 2**30
        lines.append(f"Peak CUDA memory allocated over the run: {peak:.1f} GiB.")
    else:
        lines.append("Off CUDA there are no CUDA graphs (no reduce-overhead rows) and no "
                     "memory columns; ResNet-18's compiled rows run on CUDA only.")  # fmt: skip
    return [*lines, ""]


def parse() -> tuple[argparse.Namespace, Config]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="tiny models, 3 rounds (smoke run)")
    p.add_argument("--budget-s", type=float, default=290.0, help="seconds for the whole run")
    p.add_argument("--full", action="store_true", help="no budget: every row")
    p.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES))
    p.add_argument("--precision", choices=PRECISIONS, help="amp_bf16 on CUDA, fp32 on a CPU")
    p.add_argument("--rounds", type=int, default=None, help="default 15 (--quick: 3)")
    p.add_argument("--backend", default=None, help="inductor (--quick: aot_eager)")
    p.add_argument("--out", type=Path, default=None, help="default on CUDA: " + str(RECORD))
    a = p.parse_args()
    device = torch.device(a.device)
    if device.type not in ("cpu", "cuda"):
        p.error(f"--device must be cpu or cuda, got {a.device!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda, but torch.cuda.is_available() is False: use --device cpu")
    if a.rounds is not None and a.rounds < 1:
        p.error(f"--rounds must be >= 1, got {a.rounds}")
    if a.budget_s <= 0:
        p.error(f"--budget-s must be > 0 seconds, got {a.budget_s}")
    if a.out is None and device.type == "cuda":
        a.out = RECORD
    a.rounds = a.rounds or (3 if a.quick else 15)
    a.precision = a.precision or ("amp_bf16" if device.type == "cuda" else "fp32")
    backend = a.backend or ("aot_eager" if a.quick else "inductor")
    return a, Config(device, a.quick, a.precision, backend)


def write(out: Path | None, lines: list[str], done: bool) -> None:
    if out is not None:
        tail = [] if done else ["*(The run is still going, or stopped here.)*", ""]
        out.write_text("\n".join([*lines, *tail]).rstrip() + "\n")


def main() -> None:
    start = time.perf_counter()  # the budget counts from here (importing torch: seconds before)
    args, cfg = parse()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="sbfunc-gpu-"))
    torch.backends.cudnn.benchmark = True
    torch._dynamo.config.recompile_limit = 64  # many steps compiled in one process
    runner = Runner(
        cfg.device, None if args.full else args.budget_s, args.rounds,
        block_s=0.0 if args.quick else 0.1, warmup=3, start=start,
    )  # fmt: skip
    page, verdicts = header(cfg, args), list[str]()
    print("\n".join(page), flush=True)
    for name, phase in phases(cfg, args.phases):
        lines, found = phase(cfg, runner)
        print(f"[gpu.py] {name} done at {runner.elapsed():.0f} s", file=sys.stderr, flush=True)
        print("\n".join(lines), flush=True)
        page, verdicts = page + lines, verdicts + found
        write(args.out, page, done=False)
        gc.collect()
        if cfg.device.type == "cuda":
            torch.cuda.empty_cache()
    lines = footer(cfg, runner, verdicts)
    print("\n".join(lines), flush=True)
    write(args.out, page + lines, done=True)


if __name__ == "__main__":
    main()
