"""The GPU record's ResNet-18 (``gpu.py``): ``_models.resnet18`` (CIFAR's stem, 11.2M
parameters) on random 32x32 images, 10 classes, at a batch of 256 and of 1024.

Rows (``_steps.py``'s builders): the ``torch.optim loop``; ``hand SB loop``, Selective
Backprop written by hand around that loop (a no-grad scoring forward, rank-power
Gumbel-top-k of half the rows, the loop's step on them); sbfunc's step ``plain`` and ``SB``
(``SelectiveBackprop(keep=0.5)`` selecting every step, scoring in bf16); the two parts of
SB's ideal, sbfunc's ``score forward`` of the whole batch and the loop's step on the kept
rows, and the ``ideal`` itself (their sum, per round). Eager; the compiled rows (the hand
step ``torch.compile``\\ d with SB's work, sbfunc ``compile()`` plain and SB) come last, on
CUDA only."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from _gpu_budget import (
    Bound,
    Config,
    Row,
    Runner,
    Step,
    combined,
    fixed,
    table,
    verdict,
)
from _models import resnet18
from _steps import KEEP, hand_runner, loop_runner, loop_sb_runner, sbfunc_runner, score_runner

LOOP, HAND_SB, PLAIN, SB = "torch.optim loop", "hand SB loop", "sbfunc plain", "sbfunc SB"
SCORE, IDEAL = "score forward", "ideal (score forward + loop on the kept rows)"
EAGER_S, COMPILE_S = 5.0, 90.0  # seconds to build a row (compile s: a guess for inductor)
CLASSES = 10


class Sizes(NamedTuple):
    width: int
    side: int
    batches: tuple[int, int]


FULL, QUICK = Sizes(64, 32, (256, 1024)), Sizes(8, 8, (16, 32))


def sizes(cfg: Config) -> Sizes:
    return QUICK if cfg.quick else FULL


@functools.cache
def model(cfg: Config) -> torch.nn.Module:
    torch.manual_seed(0)
    return resnet18(width=sizes(cfg).width).to(cfg.device)


def data(cfg: Config, batch: int, ids: bool = False) -> tuple[torch.Tensor, ...]:
    """Random images and labels (and sample ids ``0..batch-1``) on the device."""
    gen = torch.Generator().manual_seed(batch)
    side = sizes(cfg).side
    x = torch.randn(batch, 3, side, side, generator=gen)
    y = torch.randint(0, CLASSES, (batch,), generator=gen)
    return tuple(t.to(cfg.device) for t in (x, y, *([torch.arange(batch)] if ids else [])))


def kept(cfg: Config, batch: int) -> tuple[torch.Tensor, ...]:
    x, y = data(cfg, batch)
    k = max(1, int(KEEP * batch))
    return x[:k], y[:k]


def _row(cfg: Config, batch: int, make: Callable[[torch.nn.Module, dict[str, Any]], Any],
         on_kept: bool = False) -> Step:  # fmt: skip
    kw = {"device": cfg.device, "precision": cfg.precision}
    advance = make(copy.deepcopy(model(cfg)), kw)
    return Bound(advance, kept(cfg, batch) if on_kept else data(cfg, batch))


def _sbfunc(variant: str, mode: str, backend: str) -> Callable[..., Any]:
    return lambda m, kw: sbfunc_runner(m, variant, CLASSES, mode, backend=backend, **kw)


def eager_rows(cfg: Config, batch: int) -> list[Row]:
    k = max(1, int(KEEP * batch))
    e, b = fixed(EAGER_S * (0.2 if cfg.quick else 1.0)), cfg.backend
    builds = {
        LOOP: lambda m, kw: loop_runner(m, **kw),
        HAND_SB: lambda m, kw: loop_sb_runner(m, "rank-power", batch, **kw),
        PLAIN: _sbfunc("plain", "eager", b),
        SB: _sbfunc("SB", "eager", b),
        SCORE: lambda m, kw: score_runner(m, "eager", backend=b, **kw),
    }
    vs = {
        HAND_SB: (("vs loop", LOOP), ("vs sbfunc plain", PLAIN), ("vs ideal", IDEAL)),
        PLAIN: (("vs loop", LOOP),),
        SB: (("vs loop", LOOP), ("vs sbfunc plain", PLAIN), ("vs ideal", IDEAL),
             ("vs hand SB loop", HAND_SB)),
    }  # fmt: skip
    rows = [Row(n, functools.partial(_row, cfg, batch, f), e, vs=vs.get(n, ()))
            for n, f in builds.items()]  # fmt: skip
    on_kept = functools.partial(_row, cfg, batch, builds[LOOP], True)
    rows.append(Row(f"loop on the {k} kept rows", on_kept, e))
    return rows


def compiled_rows(cfg: Config, batch: int) -> list[Row]:
    """The eager references, then the compiled rows (CUDA graphs are the LM's: not here)."""
    e, b = fixed(EAGER_S), cfg.backend
    refs = [r for r in eager_rows(cfg, batch) if r.name in (LOOP, PLAIN)]
    builds = {
        "hand compiled SB": lambda m, kw: hand_runner(m, "rank-power", True, batch, backend=b,
                                                      **kw),
        "sbfunc compile() plain": _sbfunc("plain", "compile()", b),
        "sbfunc compile() SB": _sbfunc("SB", "compile()", b),
    }  # fmt: skip
    vs, est = (("vs loop", LOOP), ("vs sbfunc plain (eager)", PLAIN)), fixed(COMPILE_S)
    rows = [Row(n, functools.partial(_row, cfg, batch, f), est, True, vs)
            for n, f in builds.items()]  # fmt: skip
    return [r._replace(estimate=e) for r in refs] + rows


def title(cfg: Config, batch: int, what: str) -> str:
    s = sizes(cfg)
    return (f"ResNet-18 (width {s.width}), {what}: batch {batch} of {s.side}x{s.side} images, "
            f"{cfg.precision}, keep {KEEP}")  # fmt: skip


def run_eager(cfg: Config, runner: Runner, batch: int) -> tuple[list[str], list[str]]:
    """The eager table at ``batch`` with SB's ideal; at the first batch size, the verdict
    of the target: SB's step below plain's."""
    rows = eager_rows(cfg, batch)
    out, rounds, inner = runner.run(rows)
    out[IDEAL] = combined(out, [SCORE, rows[-1].name])
    specs = [(r.name, r.vs) for r in rows] + [(IDEAL, (("vs sbfunc plain", PLAIN),))]
    lines = table(title(cfg, batch, "eager"), specs, out, rounds, inner)
    if batch != sizes(cfg).batches[0]:
        return lines, []
    label = f"ResNet-18 sbfunc SB at batch {batch} below sbfunc plain's step"
    verdicts = [verdict(label, out, SB, PLAIN, 1.0, strict=True)]
    return [*lines, *verdicts, ""], verdicts


def run_compiled(cfg: Config, runner: Runner, batch: int) -> tuple[list[str], list[str]]:
    rows = compiled_rows(cfg, batch)
    out, rounds, inner = runner.run(rows)
    specs = [(r.name, r.vs) for r in rows]
    return table(title(cfg, batch, "compiled"), specs, out, rounds, inner), []
