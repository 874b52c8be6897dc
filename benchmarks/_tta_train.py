"""The training loop of the time-to-accuracy study and of the selection field: a method's
compiled step (:func:`build`, :func:`warm_up`) and ``sbfunc.fit`` a chunk at a time
(:func:`training`), so that several runs advance interleaved (:func:`interleave`)."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: see compiled_step.py

import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, TypeVar

import torch
import torch._dynamo.utils
from _tta_methods import Sizes

import sbfunc
from sbfunc import random as sbrandom


class Trainer(NamedTuple):
    """One method: its step (for init and events) and the step that trains (the same compiled
    step; a separate field so that a wrapper can time or count its calls)."""

    step: sbfunc.step.TrainStep
    compiled: Callable[..., Any]
    compile_s: float


def build(cfg: Sizes, algorithms: list[Any], loss_fn: sbfunc.module.ModuleLoss,
          steps: int, *, compile: bool = True) -> Trainer:  # fmt: skip
    """Make a method's step (cosine learning rate to zero over ``steps`` updates), compiled in
    place (``step.compile()``; eager with ``compile=False``); :func:`warm_up` compiles its
    graphs."""
    schedule = sbfunc.optim.cosine_decay_schedule(cfg.lr, steps)
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.adam(schedule), algorithms)
    if compile:
        step.compile()
    return Trainer(step, step, 0.0)


def warm_up(trainer: Trainer, init: tuple[dict, dict], x: torch.Tensor, y: torch.Tensor,
            cfg: Sizes) -> Trainer:  # fmt: skip
    """A throwaway run of up to 3 epochs on the study's data: compiles every graph a run
    meets (inside and outside SB's window, the sizes a policy scores or keeps as tables
    fill); returns the trainer with the time it took (reported as compile time)."""
    t0 = time.perf_counter()
    state = trainer.step.init(*init, key=sbrandom.key(0))
    train(trainer, state, x, y, cfg=cfg, epochs=min(cfg.epochs, 3), key=sbrandom.key(1))
    return trainer._replace(compile_s=time.perf_counter() - t0)


def eval_stops(cfg: Sizes, epochs: int, per_epoch: int) -> list[int]:
    """The steps after which :func:`train` pauses (``evals_per_epoch`` per epoch, and the
    last step)."""
    total, every = epochs * per_epoch, max(1, per_epoch // cfg.evals_per_epoch)
    return [*range(every, total, every), total]


Curve = list[tuple[float, float, int, int, Any]]
"""(wall, cpu, forwarded, backpropagated, accuracy) after each chunk of a run."""


def training(trainer: Trainer, state: sbfunc.TrainState, x: torch.Tensor, y: torch.Tensor, *,
             cfg: Sizes, epochs: int, key: sbrandom.Key,
             evaluate: Callable[[sbfunc.TrainState], torch.Tensor] | None = None,
             ) -> Iterator[tuple[sbfunc.TrainState, Curve]]:  # fmt: skip
    """``sbfunc.fit`` with the compiled step, a chunk (up to the next evaluation) per
    ``next``: yields the state and the curve so far after each chunk (the evaluation, after
    the chunk's timing, is untimed); the curve's last point holds the totals. A caller can
    advance several runs in turn, a chunk each (:func:`interleave`)."""
    per_epoch = x.shape[0] // cfg.batch
    total = epochs * per_epoch

    def data(epoch: int) -> Any:
        return sbfunc.datasets.batches(x, y, cfg.batch, key=sbrandom.fold_in(key, epoch))

    wall = cpu = 0.0
    curve: Curve = []
    for stop in eval_stops(cfg, epochs, per_epoch):
        t0, c0 = time.perf_counter(), time.process_time()
        state = sbfunc.fit(
            trainer.compiled, state, data, epochs=epochs, steps_per_epoch=per_epoch,
            stop_after=stop, progress=False, history=False,
        ).state  # fmt: skip
        wall, cpu = wall + time.perf_counter() - t0, cpu + time.process_time() - c0
        if evaluate is not None or stop == total:
            t = state.time
            acc = evaluate(state) if evaluate is not None else None
            curve.append((wall, cpu, t.samples_forwarded, t.samples_backpropagated, acc))
        yield state, curve


def interleave(runs: list[Iterator[Any]]) -> list[Any]:
    """Advance every run one chunk in turn (A B C A B C ...) until all end: a burst of load
    on the machine falls on every run alike. Returns each run's last value."""
    last: list[Any] = [None] * len(runs)
    live = list(range(len(runs)))
    while live:
        for i in list(live):
            try:
                last[i] = next(runs[i])
            except StopIteration:
                live.remove(i)
    return last


def train(trainer: Trainer, state: sbfunc.TrainState, x: torch.Tensor, y: torch.Tensor, *,
          cfg: Sizes, epochs: int, key: sbrandom.Key,
          evaluate: Callable[[sbfunc.TrainState], torch.Tensor] | None = None,
          ) -> tuple[sbfunc.TrainState, Curve]:  # fmt: skip
    """:func:`training` run to its end: the final state and the whole curve."""
    return interleave([training(trainer, state, x, y, cfg=cfg, epochs=epochs, key=key,
                                evaluate=evaluate)])[0]  # fmt: skip


K = TypeVar("K")


def rehearse(trainers: dict[K, Trainer], cfgs: dict[K, Any], init: tuple[dict, dict],
             x: torch.Tensor, y: torch.Tensor) -> dict[K, Trainer]:  # fmt: skip
    """Every trainer warmed up a second time (:func:`warm_up`, its config in ``cfgs``) once
    every step is compiled, the time added to its compile time: the frames below the steps
    are shared, so a method compiled later can shadow the graphs of one compiled earlier, which
    then recompiled in its first timed run (the committed time-to-accuracy study: ``top_k``
    and ``random`` about 5 s slower on seed 0)."""
    out = {}
    for k, t in trainers.items():
        again = warm_up(t, init, x, y, cfgs[k])
        out[k] = again._replace(compile_s=t.compile_s + again.compile_s)
    return out


def graphs_compiled() -> int:
    """How many graphs dynamo has compiled in this process so far."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
