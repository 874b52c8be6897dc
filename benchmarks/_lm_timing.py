"""The language-model study's step costs: every method's step, interleaved, on one batch.

Steps are fixed-shape, so a run's wall-clock is its steps times its step's cost; timing them
apart from the training runs keeps the curves independent of the machine's load."""

from __future__ import annotations

import fcntl
from collections.abc import Callable
from itertools import islice
from typing import Any

import torch
import torch.nn.functional as F
from _lm_runs import (
    METHODS,
    Config,
    Reference,
    _without_kind,
    lm_loss,
    load_data,
    main_model,
    optimizer,
    reference_model,
)
from _timing import interleaved, quartiles

import sbfunc
from sbfunc import random as sbrandom

LOCK = "/tmp/sbfunc-timing.lock"


def _method_step(
    cfg: Config, name: str, ref: Reference, table: torch.Tensor, batch: dict[str, torch.Tensor]
) -> Callable[[], Any]:
    method = METHODS[name]
    model = main_model(cfg, 0)
    loss_fn = lm_loss(model)
    step = sbfunc.make_train_step(
        loss_fn, optimizer(1e-3, cfg.steps, cfg.warmup), method.algorithms(cfg, ref, table)
    )
    rows = method.rows(cfg)
    fed = batch if rows is None else {k: v[:rows] for k, v in batch.items()}
    box = [
        step.init(
            *sbfunc.split_module(model, clone=True), key=sbrandom.key(0), total_steps=cfg.steps
        )
    ]

    def run() -> None:
        box[0], _ = step(box[0], fed)

    return run


def _torch_loop(cfg: Config, batch: dict[str, torch.Tensor]) -> Callable[[], Any]:
    """What a user would otherwise write: ``torch.optim.AdamW``, Hugging Face's causal-LM
    loss (``F.cross_entropy(..., ignore_index=-100)`` on the shifted labels), clipping."""
    model = main_model(cfg, 0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)

    def run() -> None:
        logits = model(batch["input_ids"], batch["attention_mask"])
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    return run


def _reference_costs(
    cfg: Config, ref: Reference, batch: dict[str, torch.Tensor]
) -> dict[str, Callable[[], Any]]:
    step = sbfunc.make_train_step(ref.loss_fn, optimizer(cfg.ref_lr, cfg.ref_steps, cfg.warmup))
    box = [step.init(dict(ref.params), dict(ref.buffers), key=sbrandom.key(0))]

    def train() -> None:
        box[0], _ = step(box[0], batch)

    def table() -> None:
        sbfunc.selective_backprop.reference_losses(
            *ref, _without_kind(batch), per="row", batch_size=cfg.batch, ids=None
        )

    return {"reference training step": train, "reference forward (table)": table}


def measure_steps(cfg: Config) -> dict[str, list[float]]:
    """Seconds per call of every method's step, the torch loop and the reference's training
    step and table forward, interleaved over ``cfg.timing_repeats`` rounds, one at a time on
    the machine (``flock`` on :data:`LOCK`)."""
    data = load_data(cfg, 0)
    ref = reference_model(cfg, 0, data)
    rows = _without_kind(data.stream_rows["mixed"])
    table = sbfunc.selective_backprop.reference_losses(*ref, rows, per="row")
    batch = next(islice(iter(data.batches["mixed"]), 0, None))
    fns = {
        name: _method_step(cfg, name, ref, table, batch)
        for name in METHODS
        if name != "plain, 0.7x budget"
    }
    fns["torch loop"] = _torch_loop(cfg, batch)
    fns |= _reference_costs(cfg, ref, batch)
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return interleaved(fns, cfg.timing_repeats, 1, warmup=3)


def ratios(times: dict[str, list[float]], base: str = "plain") -> dict[str, tuple[float, ...]]:
    """Each entry's paired per-round ratio to ``base``: (first quartile, median, third)."""
    return {
        k: quartiles([a / b for a, b in zip(v, times[base], strict=True)])
        for k, v in times.items()
    }
