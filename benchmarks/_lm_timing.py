"""The language-model study's step costs: every method's step, interleaved, on one batch.

Steps are fixed-shape, so a run's wall-clock is its steps times its step's cost; timing them
apart from the training runs keeps the curves independent of the machine's load."""

from __future__ import annotations

import fcntl
from collections.abc import Callable
from itertools import islice
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _lm_data import Config, Data, lm_loss, load_data, main_model, optimizer, without_kind
from _lm_methods import METHODS, REFERENCES, Reference, cached_reference
from _timing import interleaved, quartiles

import sbfunc
from sbfunc import random as sbrandom

LOCK = "/tmp/sbfunc-timing.lock"


def _method_step(
    cfg: Config,
    name: str,
    ref: Reference | None,
    table: torch.Tensor | None,
    batch: dict[str, torch.Tensor],
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
    cfg: Config, label: str, ref: Reference, batch: dict[str, torch.Tensor]
) -> dict[str, Callable[[], Any]]:
    step = sbfunc.make_train_step(ref.loss_fn, optimizer(cfg.ref_lr, cfg.ref_steps, cfg.warmup))
    box = [step.init(dict(ref.params), dict(ref.buffers), key=sbrandom.key(0))]

    def train() -> None:
        box[0], _ = step(box[0], batch)

    def table() -> None:
        sbfunc.selective_backprop.reference_losses(
            *ref, without_kind(batch), per="row", batch_size=cfg.batch, ids=None
        )

    return {f"{label} training step": train, f"{label} forward (table)": table}


def measure_steps(cfg: Config, cache_dir: Path) -> dict[str, list[float]]:
    """Seconds per call of every method's step, the torch loop and each kind of reference's
    training step and table forward, interleaved over ``cfg.timing_repeats`` rounds, one at a
    time on the machine (``flock`` on :data:`LOCK`). Seed 0's references, from the cache."""
    data = load_data(cfg, 0)
    refs = {name: cached_reference(cfg, 0, name, data, cache_dir)[0] for name in REFERENCES}
    batch = next(islice(iter(data.batches["mixed"]), 0, None))
    fns = {
        name: _method_step(cfg, name, *_scores(cfg, m.reference, m.table, refs, data), batch=batch)
        for name, m in METHODS.items()
        if name != "plain, 0.7x budget"
    }
    fns["torch loop"] = _torch_loop(cfg, batch)
    for name in ("small", "same-size"):  # the 4x text's reference costs the same-size one's
        fns |= _reference_costs(cfg, REFERENCES[name].label, refs[name], batch)
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return interleaved(fns, cfg.timing_repeats, 1, warmup=3)


def _scores(
    cfg: Config, reference: str | None, table: bool, refs: dict[str, Reference], data: Data
) -> tuple[Reference | None, torch.Tensor | None]:
    """A method's reference and, if it reads one, its per-row table of the mixed stream."""
    if reference is None:
        return None, None
    ref = refs[reference]
    if not table:
        return ref, None
    rows = without_kind(data.stream_rows["mixed"])
    return ref, sbfunc.selective_backprop.reference_losses(*ref, rows, per="row")


def ratios(times: dict[str, list[float]], base: str = "plain") -> dict[str, tuple[float, ...]]:
    """Each entry's paired per-round ratio to ``base``: (first quartile, median, third)."""
    return {
        k: quartiles([a / b for a, b in zip(v, times[base], strict=True)])
        for k, v in times.items()
    }
