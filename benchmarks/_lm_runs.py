"""The language-model study's data, methods and lockstep runs (``language_model.py``)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from functools import cache
from itertools import islice
from pathlib import Path
from typing import Any, NamedTuple

import torch

import sbfunc
from sbfunc import datasets as D
from sbfunc import random as sbrandom
from sbfunc import selective_backprop as S

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


def lm_loss(model: torch.nn.Module) -> sbfunc.module.ModuleLoss:
    return sbfunc.per_sample_loss(
        model,
        sbfunc.module.next_token_cross_entropy,
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


# ----------------------------------------------------------------------------- reference
class Reference(NamedTuple):
    loss_fn: sbfunc.module.ModuleLoss
    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]


def reference_model(cfg: Config, seed: int, data: Data) -> Reference:
    """The reference: a small LM trained ``cfg.ref_steps`` steps on the clean split."""
    model = sbfunc.models.CausalLM(
        d_model=cfg.ref_width,
        num_heads=max(1, cfg.ref_width // 32),
        num_layers=cfg.ref_layers,
        max_len=cfg.seq_len,
        key=sbrandom.key(10_000 + seed),
    )
    loss_fn = lm_loss(model)
    step = sbfunc.make_train_step(loss_fn, optimizer(cfg.ref_lr, cfg.ref_steps, cfg.warmup))
    params, buffers = sbfunc.split_module(model, clone=True)
    state = step.init(params, buffers, key=sbrandom.key(seed))
    for batch in islice(_epochs(data.reference, cfg.batch, seed), cfg.ref_steps):
        state, _ = step(state, batch)
    return Reference(loss_fn, state.params, state.buffers)


def _epochs(rows: Batch, batch: int, seed: int) -> Iterator[Batch]:
    for epoch in range(1 << 30):
        key = sbrandom.fold_in(sbrandom.key(20_000 + seed), epoch)
        yield from D.dict_batches(rows, batch, key=key)


# ----------------------------------------------------------------------------- methods
class Method(NamedTuple):
    """One run's recipe: its algorithms, the rows of each batch it trains on (``None``: all),
    its budget as a fraction of the steps, and whose tuned learning rate it takes."""

    algorithms: Callable[[Config, Reference, torch.Tensor], list[sbfunc.Algorithm]]
    rows: Callable[[Config], int | None]
    budget: float
    lr_of: str


def _none(cfg: Config, ref: Reference, table: torch.Tensor) -> list[sbfunc.Algorithm]:
    return []


def _all(cfg: Config) -> int | None:
    return None


METHODS: dict[str, Method] = {
    "plain": Method(_none, _all, 1.0, "plain"),
    "plain, 0.7x budget": Method(_none, _all, 0.7, "plain"),
    "uniform tokens": Method(
        lambda cfg, ref, table: [S.TokenSelection(cfg.keep, score="uniform")],
        _all,
        1.0,
        "selective LM",
    ),
    "uniform sequences": Method(_none, lambda cfg: int(cfg.keep * cfg.batch), 1.0, "selective LM"),
    "selective LM": Method(
        lambda cfg, ref, table: [S.TokenSelection(cfg.keep, reference=S.reference_model(*ref))],
        _all,
        1.0,
        "selective LM",
    ),
    "RHO-LOSS sequences": Method(
        lambda cfg, ref, table: [
            sbfunc.SelectiveBackprop(
                start=0.0,
                end=1.0,
                interrupt=0,
                ids="ids",
                policy=sbfunc.policies.rho_loss(cfg.keep, table),
            )
        ],
        _all,
        1.0,
        "selective LM",
    ),
}
TUNED = ("plain", "selective LM")
# the sequence-level methods filter off-target rows: on the clean stream, only the token ones
ON_CLEAN = ("plain", "plain, 0.7x budget", "uniform tokens", "selective LM")


# ----------------------------------------------------------------------------- runs
class Run:
    """One method's run in a lockstep group: its step, state and curve."""

    def __init__(
        self, cfg: Config, name: str, lr: float, seed: int, ref: Reference, table: torch.Tensor
    ) -> None:
        method = METHODS[name]
        self.name, self.lr, self.rows = name, lr, method.rows(cfg)
        self.steps = round(method.budget * cfg.steps)
        model = main_model(cfg, seed)
        self.loss_fn = lm_loss(model)
        self.step = sbfunc.make_train_step(
            self.loss_fn,
            optimizer(lr, self.steps, cfg.warmup),
            method.algorithms(cfg, ref, table),
        )
        params, buffers = sbfunc.split_module(model, clone=True)
        self.state = self.step.init(
            params, buffers, key=sbrandom.key(seed), total_steps=self.steps
        )
        self.curve: list[tuple[int, float]] = []
        self.kept_rows = torch.zeros(len(KINDS))
        self.seen_rows = torch.zeros(len(KINDS))

    def advance(self, batch: Batch) -> None:
        fed = batch if self.rows is None else {k: v[: self.rows] for k, v in batch.items()}
        self.state, metrics = self.step(self.state, fed)
        kind = fed["kind"]
        kept = kind if metrics.kept is None else kind[metrics.kept.indices]
        self.seen_rows += torch.bincount(batch["kind"], minlength=len(KINDS))
        self.kept_rows += torch.bincount(kept, minlength=len(KINDS))


def heldout_loss(
    loss_fn: sbfunc.module.ModuleLoss, params: Any, buffers: Any, rows: Batch, chunk: int = 64
) -> float:
    """The mean loss over every real token of ``rows`` (Hugging Face's objective), eval mode."""
    total = count = 0.0
    with torch.no_grad():
        for i in range(0, len(rows["ids"]), chunk):
            batch = {k: v[i : i + chunk] for k, v in rows.items()}
            tokens = loss_fn.elements(sbfunc.predict(loss_fn, params, buffers, batch), batch)
            total += float(tokens.losses[tokens.mask].sum())
            count += float(tokens.mask.sum())
    return total / count


def kept_token_kinds(run: Run, ref: Reference, batch: Batch, keep: float) -> torch.Tensor:
    """Which kinds of tokens selective LM keeps in ``batch`` with the run's current weights
    (the step's rule, its own tie-break key aside): kept and real tokens per kind, ``[2, 3]``."""
    with torch.no_grad():
        own = run.loss_fn.elements(
            run.loss_fn.forward(run.state.params, run.state.buffers, batch), batch
        )
        base = ref.loss_fn.elements(
            sbfunc.predict(ref.loss_fn, ref.params, ref.buffers, batch), batch
        )
    kept = S.kept_tokens(own.losses - base.losses, own.mask, keep, sbrandom.key(0))
    kind = batch["kind"][:, None].expand_as(own.mask)
    return torch.stack(
        [torch.bincount(kind[m], minlength=len(KINDS)).float() for m in (kept, own.mask)]
    )


def _key(cfg: Config, seed: int, stream: str, name: str, lr: float) -> str:
    blob = json.dumps([asdict(cfg) | {"seeds": None}, seed, stream, name, lr], sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def run_methods(
    cfg: Config, seed: int, stream: str, wanted: list[tuple[str, float]], cache_dir: Path
) -> list[Row]:
    """Run ``wanted`` ``(method, lr)`` pairs of one seed and stream in lockstep, one step
    each in turn; cached results are read instead."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    paths = {w: cache_dir / f"{_key(cfg, seed, stream, *w)}.json" for w in wanted}
    todo = [w for w in wanted if not paths[w].exists()]
    if todo:
        data = load_data(cfg, seed)
        ref = reference_model(cfg, seed, data)
        table = S.reference_losses(*ref, _without_kind(data.stream_rows[stream]), per="row")
        runs = [Run(cfg, name, lr, seed, ref, table) for name, lr in todo]
        kinds = torch.zeros(2, len(KINDS))
        for i, batch in enumerate(data.batches[stream]):
            for run in runs:
                if i % cfg.eval_every == 0 and i <= run.steps:
                    run.curve.append(
                        (
                            i,
                            heldout_loss(
                                run.loss_fn, run.state.params, run.state.buffers, data.heldout
                            ),
                        )
                    )
                    if run.name == "selective LM":
                        kinds += kept_token_kinds(run, ref, batch, cfg.keep)
                if i < run.steps:
                    run.advance(batch)
            if (i + 1) % 50 == 0:
                print(f"seed {seed} {stream}: step {i + 1}/{cfg.steps}", flush=True)
        for run in runs:
            if run.curve[-1][0] != run.steps:
                run.curve.append(
                    (
                        run.steps,
                        heldout_loss(
                            run.loss_fn, run.state.params, run.state.buffers, data.heldout
                        ),
                    )
                )
            token_kinds = kinds if run.name == "selective LM" else None
            paths[(run.name, run.lr)].write_text(
                json.dumps(_row(cfg, seed, stream, run, token_kinds))
            )
    return [json.loads(paths[w].read_text()) for w in wanted]


def _without_kind(rows: Batch) -> Batch:
    return {k: v for k, v in rows.items() if k != "kind"}


def _row(cfg: Config, seed: int, stream: str, run: Run, kinds: torch.Tensor | None) -> Row:
    tokens = cfg.batch * (cfg.seq_len - 1)
    kept = (run.kept_rows / run.seen_rows.clamp(min=1)).tolist()
    if kinds is not None:  # selective LM's tokens, measured at the evaluations
        kept = (kinds[0] / kinds[1].clamp(min=1)).tolist()
    elif run.name == "uniform tokens":  # a uniform draw over every kind
        kept = [cfg.keep] * len(KINDS)
    return {
        "seed": seed,
        "stream": stream,
        "method": run.name,
        "lr": run.lr,
        "steps": run.steps,
        "total_steps": cfg.steps,
        "curve": run.curve,
        "tokens_per_step": tokens,
        "final": run.curve[-1][1],
        "kept_by_kind": dict(zip(KINDS, kept, strict=True)),
    }


def tune_lrs(cfg: Config, stream: str, cache_dir: Path) -> dict[str, float]:
    """The learning rate of each tuned method on seed 0: the lowest final held-out loss."""
    wanted = [(name, lr) for name in TUNED for lr in cfg.lrs]
    rows = run_methods(cfg, cfg.seeds[0], stream, wanted, cache_dir)
    return {
        name: min((r for r in rows if r["method"] == name), key=lambda r: r["final"])["lr"]
        for name in TUNED
    }


def run_group(
    cfg: Config, seed: int, stream: str, lrs: dict[str, float], cache_dir: Path
) -> list[Row]:
    """Every method of one seed and stream at its tuned learning rate."""
    names = [name for name in METHODS if stream == "mixed" or name in ON_CLEAN]
    wanted = [(name, lrs[METHODS[name].lr_of]) for name in names]
    return run_methods(cfg, seed, stream, wanted, cache_dir)


def all_tuning_rows(cfg: Config, stream: str, cache_dir: Path) -> list[Row]:
    """The tuning runs (cached by ``tune_lrs``), for the report."""
    wanted = [(name, lr) for name in TUNED for lr in cfg.lrs]
    return run_methods(cfg, cfg.seeds[0], stream, wanted, cache_dir)
