"""The language-model study's configuration, data, model and optimizer (``language_model.py``)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from itertools import islice
from typing import Any, NamedTuple

import torch

import sbfunc
from sbfunc import datasets as D
from sbfunc import random as sbrandom

Row = dict[str, Any]
Batch = dict[str, torch.Tensor]
KINDS = ("code", "random", "english")


@dataclass(frozen=True)
class Config:
    """Study sizes; ``language_model.FULL`` is the committed run, ``QUICK`` a smoke run."""

    steps: int = 500
    batch: int = 32
    seq_len: int = 128
    keep: float = 0.6
    warmup: int = 20
    eval_every: int = 25
    eval_rows: int = 256  # held-out rows, the same for every method of a seed
    lrs: tuple[float, ...] = (1e-3, 3e-3)
    seeds: tuple[int, ...] = (0, 1, 2)
    ref_layers: int = 1
    ref_width: int = 64
    ref_steps: int = 300
    ref_lr: float = 3e-3
    max_bytes: int = 4 << 20
    timing_repeats: int = 15
    threads: int = 1


class Data(NamedTuple):
    """One seed's batches (per stream), held-out rows and the reference's clean split."""

    batches: dict[str, list[Batch]]
    heldout: Batch
    reference: Batch
    stream_rows: dict[str, Batch]


@cache
def corpus(seq_len: int, max_bytes: int) -> D.TextCorpus:
    return D.stdlib_corpus(seq_len=seq_len, max_bytes=max_bytes)


def load_data(cfg: Config, seed: int) -> Data:
    """The seed's split by whole files, its two streams (the same row order: the mixed one
    replaces half of the rows in place) and ``cfg.steps`` batches of each."""
    c = corpus(cfg.seq_len, cfg.max_bytes)
    key = sbrandom.fold_in(sbrandom.key(1000), seed)
    split = D.split_corpus(c, heldout=0.1, reference=0.05, key=sbrandom.fold_in(key, 0))
    mixed = D.mixed_stream(
        split.train,
        c.english,
        random_fraction=0.25,
        english_fraction=0.25,
        key=sbrandom.fold_in(key, 1),
    )
    # ids index the per-row reference table: row i of a stream gets id i
    ids = torch.arange(len(mixed["ids"]))
    rows = {"clean": {**split.train, "ids": ids}, "mixed": {**mixed, "ids": ids}}
    order = sbrandom.fold_in(key, 2)
    batches = {
        s: list(islice(D.dict_batches(r, cfg.batch, key=order), cfg.steps))
        for s, r in rows.items()
    }
    pick = torch.randperm(len(split.heldout["ids"]), generator=torch.Generator().manual_seed(seed))
    heldout = {k: v[pick[: cfg.eval_rows]] for k, v in split.heldout.items()}
    return Data(batches, heldout, dict(split.reference), rows)


def outside_rows(cfg: Config, n: int) -> Batch:
    """``n`` rows of clean code from standard-library files **outside the study's corpus**:
    the files :func:`sbfunc.datasets.stdlib_corpus` reads next (its sha256 order of paths, a
    pseudo-random sample of the library), so no text of the training streams or the held-out
    files; rows of whole files in that order, the last file cut at ``n`` rows."""
    inside = set(corpus(cfg.seq_len, cfg.max_bytes).paths)
    big = corpus(cfg.seq_len, 2 * cfg.max_bytes)
    order = sorted(
        (i for i, p in enumerate(big.paths) if p not in inside),
        key=lambda i: hashlib.sha256(big.paths[i].encode()).digest(),
    )
    rank = torch.full((len(big.paths),), len(big.paths))
    rank[torch.tensor(order, dtype=torch.int64)] = torch.arange(len(order))
    row_rank = rank[big.files]
    pick = torch.argsort(row_rank, stable=True)[:n]
    if len(pick) < n or int(row_rank[pick].max()) >= len(order):
        raise ValueError(f"the library has fewer than {n} rows outside the study's corpus")
    return {k: v[pick] for k, v in big.rows.items()}


def lm_loss(model: torch.nn.Module) -> sbfunc.module.ModuleLoss:
    return sbfunc.per_sample_loss(
        model,
        sbfunc.module.next_token_cross_entropy,  # type: ignore[arg-type]  # typed as -> Tensor
        input=("input_ids", "attention_mask"),
        target="labels",
    )


def main_model(cfg: Config, seed: int) -> torch.nn.Module:
    return sbfunc.models.CausalLM(max_len=cfg.seq_len, key=sbrandom.key(seed))


def optimizer(lr: float, steps: int, warmup: int) -> sbfunc.optim.GradientTransformation:
    """AdamW with a linear warm-up and a cosine decay to zero at ``steps``, clipped to norm 1
    (the usual language-model recipe)."""
    schedule = sbfunc.optim.warmup_cosine_decay_schedule(0.0, lr, warmup, steps)
    return sbfunc.optim.chain(
        sbfunc.optim.clip_by_global_norm(1.0),
        sbfunc.optim.adamw(schedule, b1=0.9, b2=0.95, weight_decay=0.1),
    )


def epochs(rows: Batch, batch: int, seed: int) -> Iterator[Batch]:
    """Batches of ``rows``, reshuffled every epoch, without end (a reference's training)."""
    for epoch in range(1 << 30):
        key = sbrandom.fold_in(sbrandom.key(20_000 + seed), epoch)
        yield from D.dict_batches(rows, batch, key=key)


def heldout_loss(
    loss_fn: sbfunc.module.ModuleLoss, params: Any, buffers: Any, rows: Batch, chunk: int = 64
) -> float:
    """The mean loss over every real token of ``rows`` (Hugging Face's objective), eval mode."""
    total = count = 0.0
    with torch.no_grad():
        for i in range(0, len(rows["ids"]), chunk):
            batch = {k: v[i : i + chunk] for k, v in rows.items()}
            tokens = token_losses(loss_fn, sbfunc.predict(loss_fn, params, buffers, batch), batch)
            total += float(tokens.losses[tokens.mask].sum())
            count += float(tokens.mask.sum())
    return total / count


def token_losses(
    loss_fn: sbfunc.module.ModuleLoss, outputs: Any, batch: Batch
) -> sbfunc.module.TokenLosses:
    """The token losses of ``outputs`` (the study's loss is over tokens)."""
    tokens = loss_fn.elements(outputs, batch)
    assert isinstance(tokens, sbfunc.module.TokenLosses)
    return tokens


def without_kind(rows: Batch) -> Batch:
    return {k: v for k, v in rows.items() if k != "kind"}
