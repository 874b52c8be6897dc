"""Host overhead of one training step: sbfunc's step against a hand-written pure step.

On a model with (almost) no compute, a step's time is its host time: Python, dispatch and,
compiled, dynamo's guard checks and frame transitions. For each model it times, interleaved
(A B C A B C ..., one process, same batch; medians and the spread of per-round ratios):

* ``torch.optim loop``: ``opt.zero_grad(); F.cross_entropy(model(x), y).backward();
  opt.step()`` with ``torch.optim.Adam``;
* ``hand ...``: a hand-written pure step (``functional_call`` + ``torch.func.grad_and_value``
  + Adam in tensor ops), eagerly and ``torch.compile(fullgraph=True)``d: the reference limit.
  Its SB variant does Selective Backprop's work by hand: a no-grad scoring forward, a
  rank-power Gumbel-top-k draw of half the rows (noise from an :mod:`sbfunc.random` key, as
  sbfunc draws it), the gradient on the kept rows; ``hand SB top-k`` keeps the top half
  instead (no noise);
* ``sbfunc ...``: ``sbfunc.make_train_step`` eagerly, ``torch.compile(step)``d
  (``compiled``) and compiled in place with ``step.compile()`` (``compile()``: the host plan
  and finish as plain Python around the compiled core), plain,
  with ``SelectiveBackprop(keep=0.5)`` selecting on every step, and with SB + CutOut + MixUp +
  LabelSmoothing.

Targets (issue 18): compiled sbfunc (both ways) <= 1.25x the compiled hand step (plain vs
plain, SB vs hand SB), <= 1.5x with SB + 3 (vs hand SB); eager sbfunc plain <= 1.1x and SB
<= 1.5x the torch.optim loop. Models: the zero-compute ``Flatten-Linear(8,8)-ReLU-Linear(8,2)``
at batch 8 on ``[8, 1, 8]`` inputs (the Flatten lets CutOut see a ``[N, C, L]`` input; it is
a view) at 1 thread, and the quickstart and study CNNs (from ``compiled_step.py``) at 2
threads. For the compiled sbfunc steps on the zero model it also reports the profiler's
dynamo cache lookups per step and the graph breaks (``torch._dynamo`` counters) with their
reasons.

Run: ``python benchmarks/host_overhead.py`` (``--models zero quickstart study``, ``--rounds``,
``--threads``, ``--quick`` for a smoke run; ``--profile DIR`` writes cProfile tables of
sbfunc's and the hand-written steps on the zero model and exits).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # a shared machine: see compiled_step.py

import argparse
import collections
import cProfile
import functools
import pstats
import re
import statistics
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

import sbfunc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import interleaved
from compiled_step import quickstart_cnn, study_cnn

LR = 1e-3
KEEP = 0.5
Batch = tuple[torch.Tensor, torch.Tensor]

# --- sbfunc-specific construction: the only code that touches sbfunc's step API ------------


def sbfunc_algorithms(variant: str, model: nn.Module, classes: int) -> list[sbfunc.Algorithm]:
    """The algorithms of a variant: ``plain``, ``SB`` or ``SB+3``."""
    if variant == "plain":
        return []
    score_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    sb = sbfunc.SelectiveBackprop(
        start=0.0, end=1.0, keep=KEEP, interrupt=0, scoring=sbfunc.score.Scoring(loss_fn=score_fn)
    )
    if variant == "SB":
        return [sb]
    return [sb, sbfunc.algorithms.CutOut(), sbfunc.algorithms.MixUp(num_classes=classes),
            sbfunc.algorithms.LabelSmoothing(num_classes=classes)]  # fmt: skip


def sbfunc_runner(model: nn.Module, variant: str, classes: int, mode: str) -> Any:
    """``advance(batch)``: one sbfunc training step on its own state (built here); ``mode``:
    ``"eager"``, ``"compiled"`` (``torch.compile(step)``) or ``"compile()"``
    (``step.compile()``: the host plan around the compiled core), and two attribution modes:
    ``"compile()+guards"`` (``step.compile(library_guards=True)``: what the guard filter
    saves) and ``"compile()/allow"`` (``nonfinite="allow"``: what the non-finite guard
    costs)."""
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    algorithms = sbfunc_algorithms(variant, model, classes)
    nonfinite = "allow" if mode == "compile()/allow" else "skip"
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.adam(LR), algorithms, nonfinite=nonfinite)
    params, buffers = sbfunc.split_module(model, clone=True)
    state = [step.init(params, buffers, key=sbfunc.random.key(0))]
    call = torch.compile(step) if mode == "compiled" else step
    if mode.startswith("compile()"):
        step.compile(library_guards=mode == "compile()+guards")

    def advance(batch: Batch) -> None:
        state[0] = call(state[0], batch)[0]

    return advance


# --- the hand-written pure step (the reference limit) ---------------------------------------


class HandState(NamedTuple):
    params: dict[str, torch.Tensor]
    mu: dict[str, torch.Tensor]
    nu: dict[str, torch.Tensor]
    steps: torch.Tensor  # 0-d int64: steps done
    key: torch.Tensor


def hand_runner(model: nn.Module, select: str | None, compiled: bool, batch: int) -> Any:
    """A pure step written by hand; ``select``: ``None``, ``"rank-power"`` or ``"top-k"``."""
    k = max(1, int(KEEP * batch))
    log_w = (1.0 / KEEP - 1.0) * torch.log((torch.arange(batch) + 0.5) / batch)  # rank power
    b1, b2, eps = 0.9, 0.999, 1e-8

    def loss(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(torch.func.functional_call(model, p, (x,)), y)

    grad_and_value = torch.func.grad_and_value(loss)

    def step(s: HandState, x: torch.Tensor, y: torch.Tensor) -> tuple[HandState, torch.Tensor]:
        if select is not None:
            with torch.no_grad():
                logits = torch.func.functional_call(model, s.params, (x,))
                scores = F.cross_entropy(logits, y, reduction="none")
            if select == "top-k":
                rows = torch.topk(scores, k, sorted=False).indices
            else:  # positions drawn in ascending-score order, then mapped back
                g = sbfunc.random.gumbel(sbfunc.random.fold_in(s.key, s.steps), (batch,))
                positions = torch.topk(log_w + g, k, sorted=False).indices
                rows = torch.argsort(scores)[positions]
            rows = torch.sort(rows).values
            x, y = x[rows], y[rows]
        grads, value = grad_and_value(s.params, x, y)
        count = s.steps + 1
        c1, c2 = 1 - b1**count, 1 - b2**count
        mu = {n: b1 * s.mu[n] + (1 - b1) * g for n, g in grads.items()}
        nu = {n: b2 * s.nu[n] + (1 - b2) * g * g for n, g in grads.items()}
        params = {
            n: p - LR * (mu[n] / c1) / ((nu[n] / c2).sqrt() + eps) for n, p in s.params.items()
        }
        return HandState(params, mu, nu, count, s.key), value

    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    zeros = {n: torch.zeros_like(p) for n, p in params.items()}
    state = [HandState(params, zeros, dict(zeros), torch.zeros((), dtype=torch.int64),
                       sbfunc.random.key(0))]  # fmt: skip
    # dynamo caches graphs per code object: each hand step gets its own (as TrainStep does),
    # so no step checks another's guards and no model runs into the recompile limit
    own = types.FunctionType(
        step.__code__.replace(), step.__globals__, "step", None, step.__closure__
    )
    call = torch.compile(own, fullgraph=True) if compiled else step

    def advance(b: Batch) -> None:
        state[0] = call(state[0], *b)[0]

    return advance


def loop_runner(model: nn.Module) -> Any:
    opt = torch.optim.Adam(model.parameters(), LR)

    def advance(b: Batch) -> None:
        opt.zero_grad()
        F.cross_entropy(model(b[0]), b[1]).backward()
        opt.step()

    return advance


# --- models, rows, targets -----------------------------------------------------------------


def zero_model() -> tuple[nn.Module, tuple[int, ...], int]:
    return nn.Sequential(nn.Flatten(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)), (1, 8), 8


MODELS: dict[str, tuple[Callable[[], tuple[nn.Module, tuple[int, ...], int]], int, int]] = {
    "zero": (zero_model, 2, 1),  # builder, classes, default threads
    "quickstart": (quickstart_cnn, 10, 2),
    "study": (study_cnn, 10, 2),
}
ROOT_ROW = "torch.optim loop"
# row: (hand counterpart, target vs hand, target vs loop)
ROWS: dict[str, tuple[str | None, float | None, float | None]] = {
    "torch.optim loop": (None, None, None),
    "hand eager plain": (None, None, None),
    "hand eager SB": (None, None, None),
    "hand compiled plain": (None, None, None),
    "hand compiled SB": (None, None, None),
    "hand compiled SB top-k": (None, None, None),
    "sbfunc eager plain": ("hand eager plain", None, 1.1),
    "sbfunc eager SB": ("hand eager SB", None, 1.5),
    "sbfunc eager SB+3": ("hand eager SB", None, None),
    "sbfunc compiled plain": ("hand compiled plain", 1.25, None),
    "sbfunc compiled SB": ("hand compiled SB", 1.25, None),
    "sbfunc compiled SB+3": ("hand compiled SB", 1.5, None),
    "sbfunc compile() plain": ("hand compiled plain", 1.25, None),
    "sbfunc compile() SB": ("hand compiled SB", 1.25, None),
    "sbfunc compile() SB+3": ("hand compiled SB", 1.5, None),
    # attribution (zero model only): the guard filter's share, the non-finite guard's share
    "sbfunc compile()+guards plain": ("hand compiled plain", None, None),
    "sbfunc compile()+guards SB": ("hand compiled SB", None, None),
    "sbfunc compile()/allow plain": ("hand compiled plain", None, None),
    "sbfunc compile()/allow SB": ("hand compiled SB", None, None),
}
ATTRIBUTION = ("compile()+guards", "compile()/allow")


def is_compiled(name: str) -> bool:
    return " compiled " in name or " compile()" in name


def make_row(name: str, build: Callable[[], Any], classes: int) -> Any:
    torch.manual_seed(0)  # the same initial weights for every row
    model, _, batch = build()
    if name == "torch.optim loop":
        return loop_runner(model)
    if name.startswith("hand"):
        select = "top-k" if name.endswith("top-k") else ("rank-power" if "SB" in name else None)
        return hand_runner(model, select, is_compiled(name), batch)
    _, mode, variant = name.split(" ")
    return sbfunc_runner(model, variant, classes, mode)


def quartiles(v: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3
    return q[0], statistics.median(v), q[2]


def compile_facts(counters: Any) -> str:
    """Frames, graphs and graph breaks (with the function each break is at) of one compile."""
    reasons = []
    for reason, n in counters["graph_break"].items():
        at = re.search(r"function `<function ([\w.]+)|the function `(\w+)`", reason)
        what = "" if at is None else f" ({at.group(1) or at.group(2)})"
        reasons.append(f"{n}x {reason.strip().splitlines()[0]}{what}")
    return (
        f"{sum(counters['resumes'].values())} resume functions, "
        f"{counters['stats']['unique_graphs']} graphs, {sum(counters['graph_break'].values())} "
        "graph breaks" + "".join(f"\n      {r}" for r in reasons)
    )


def dynamo_facts(advance: Callable[[], None], steps: int = 20) -> str:
    """Cache lookups and compiled regions per step (profiler), over ``steps`` steps."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            advance()
    names = collections.Counter(e.name for e in prof.events())
    lookups = names["TorchDynamo Cache Lookup"] / steps
    regions = sum(c for n, c in names.items() if n.startswith("Torch-Compiled Region")) / steps
    return f"{lookups:.0f} cache lookups, {regions:.0f} compiled regions per step"


def bench(model_name: str, rounds: int, inner: int, quick: bool) -> None:
    build, classes, _ = MODELS[model_name]
    _, shape, batch = build()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, *shape, generator=gen)
    data = (x, torch.randint(0, classes, (batch,), generator=gen))
    torch.compile(torch.sin)(torch.ones(1))  # inductor's one-time start-up, outside the rows
    fns: dict[str, Callable[[], None]] = {}
    compile_s: dict[str, float] = {}
    breaks: dict[str, str] = {}
    rows = {n: v for n, v in ROWS.items()
            if model_name == "zero" or n.split(" ")[1] not in ATTRIBUTION}  # fmt: skip
    for name in rows:
        advance = make_row(name, build, classes)
        fns[name] = functools.partial(advance, data)
        if is_compiled(name):
            torch._dynamo.utils.counters.clear()
            t0 = time.perf_counter()
            fns[name]()
            compile_s[name] = time.perf_counter() - t0
            breaks[name] = compile_facts(torch._dynamo.utils.counters)
    t = interleaved(fns, rounds, inner, warmup=3 if quick else 10)
    for name, fn in fns.items():  # steady cost of a compiled call, timed apart from compiling
        if name in compile_s:
            compile_s[name] -= statistics.median(t[name])
            if model_name == "zero" and name.startswith("sbfunc"):
                breaks[name] += f"\n    {dynamo_facts(fn)}"
    print(f"\n## {model_name}: batch {batch}, input {list(shape)}, {torch.get_num_threads()} "
          f"threads, {rounds} rounds x {inner} steps")  # fmt: skip
    cols = (
        ("us/step", 9),
        ("[IQR]", 16),
        ("vs loop", 9),
        ("[IQR]", 14),
        ("vs hand", 9),
        ("[IQR]", 14),
    )
    head = f"{'row':30}" + "".join(f"{c:>{w}}" for c, w in cols) + "  target"
    print(head + "\n" + "-" * (len(head) + 22))
    for name, (hand, t_hand, t_loop) in rows.items():
        lo, med, hi = quartiles([s * 1e6 for s in t[name]])
        line = f"{name:30}{med:9.1f}{f'[{lo:.0f}-{hi:.0f}]':>16}"
        verdicts = []
        for ref, target in ((ROOT_ROW, t_loop), (hand, t_hand)):
            if ref is None or ref == name:
                line += " " * 23
                continue
            r = quartiles([a / b for a, b in zip(t[name], t[ref], strict=True)])
            line += f"{r[1]:9.2f}{f'[{r[0]:.2f}-{r[2]:.2f}]':>14}"
            if target is not None:
                ok = "MET" if r[1] <= target else "MISSED"
                verdicts.append(f"{'loop' if ref == ROOT_ROW else 'hand'}<={target} {ok}")
        print(line + "  " + ", ".join(verdicts))
    print("ratios: median of per-round ratios [IQR]; vs hand: the hand-written step in the same "
          "mode (SB+3 against hand SB)")  # fmt: skip
    print("compile s (first call minus a steady one; inductor's on-disk caches as found) and "
          "dynamo facts:")  # fmt: skip
    for name, s in compile_s.items():
        print(f"  {name:30}{s:6.1f} s  {breaks[name]}")


def profile_steps(out: Path, steps: int) -> None:
    """cProfile of the zero model's eager and compiled sbfunc steps (plain and SB) and of the
    compiled hand-written steps: top 25 functions by cumulative and by own time, written to
    ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    build, classes, _ = MODELS["zero"]
    data = (torch.randn(8, 1, 8), torch.randint(0, classes, (8,)))
    for name in ("sbfunc eager SB", "sbfunc compiled SB", "sbfunc eager plain",
                 "sbfunc compiled plain", "sbfunc compile() plain", "sbfunc compile() SB",
                 "hand compiled plain", "hand compiled SB"):  # fmt: skip
        advance = make_row(name, build, classes)
        for _ in range(20):  # compile and warm up
            advance(data)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(steps):
            advance(data)
        prof.disable()
        path = out / (name.replace(" ", "_") + ".txt")
        with path.open("w") as f:
            f.write(f"{name}: {steps} steps\n")
            for key in ("cumulative", "tottime"):
                pstats.Stats(prof, stream=f).strip_dirs().sort_stats(key).print_stats(25)
        prof.dump_stats(path.with_suffix(".prof"))
        print(f"{name}: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=["zero"])
    parser.add_argument("--rounds", type=int, default=None, help="default 200 (CNNs: 20)")
    parser.add_argument("--threads", type=int, default=None, help="default 1 (CNNs: 2)")
    parser.add_argument("--quick", action="store_true", help="few rounds (smoke run)")
    parser.add_argument("--profile", type=Path, default=None, help="write cProfile tables here")
    args = parser.parse_args()
    for flag in ("rounds", "threads"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    print(f"torch {torch.__version__}, sbfunc {sbfunc.__version__}")
    if args.profile is not None:
        torch.set_num_threads(args.threads or 1)
        profile_steps(args.profile, 50 if args.quick else 2000)
        return
    for name in args.models:
        torch.set_num_threads(args.threads or MODELS[name][2])
        zero = name == "zero"
        rounds = args.rounds or (3 if args.quick else 200 if zero else 20)
        bench(name, rounds, 20 if zero else 2, args.quick)


if __name__ == "__main__":
    main()
