"""The language-model study's lockstep runs, cached (``language_model.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from _lm_data import (
    KINDS,
    Batch,
    Config,
    Row,
    heldout_loss,
    lm_loss,
    load_data,
    main_model,
    optimizer,
    token_losses,
    without_kind,
)
from _lm_methods import (
    METHODS,
    ON_CLEAN,
    REFERENCES,
    TUNED,
    Reference,
    cache_key,
    cached_reference,
)

import sbfunc
from sbfunc import random as sbrandom
from sbfunc import selective_backprop as S


class Run:
    """One method's run in a lockstep group: its step, state and curve."""

    def __init__(
        self,
        cfg: Config,
        name: str,
        lr: float,
        seed: int,
        ref: Reference | None,
        table: torch.Tensor | None,
    ) -> None:
        method = METHODS[name]
        self.name, self.lr, self.rows = name, lr, method.rows(cfg)
        self.ref, self.keep_at = ref, method.keep_at
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
        self.token_kinds = torch.zeros(2, len(KINDS))  # kept and real tokens, token selection

    def advance(self, batch: Batch) -> None:
        fed = batch if self.rows is None else {k: v[: self.rows] for k, v in batch.items()}
        self.state, metrics = self.step(self.state, fed)
        kind = fed["kind"]
        kept = kind if metrics.kept is None else kind[metrics.kept.indices]
        self.seen_rows += torch.bincount(batch["kind"], minlength=len(KINDS))
        self.kept_rows += torch.bincount(kept, minlength=len(KINDS))

    def evaluate(self, cfg: Config, i: int, heldout: Batch, batch: Batch) -> None:
        """The held-out loss before step ``i``, and for token selection by excess loss the
        kinds of ``batch``'s tokens it would keep now."""
        loss = heldout_loss(self.loss_fn, self.state.params, self.state.buffers, heldout)
        self.curve.append((i, loss))
        if self.keep_at is not None and i < self.steps:
            self.token_kinds += kept_token_kinds(self, batch, self.keep_at(cfg, i / self.steps))


def kept_token_kinds(run: Run, batch: Batch, keep: float) -> torch.Tensor:
    """Which kinds of tokens a selective LM run keeps in ``batch`` with its current weights
    (the step's rule, its own tie-break key aside): kept and real tokens per kind, ``[2, 3]``."""
    assert run.ref is not None
    ref = run.ref
    with torch.no_grad():
        own = token_losses(
            run.loss_fn, run.loss_fn.forward(run.state.params, run.state.buffers, batch), batch
        )
        base = token_losses(
            ref.loss_fn, sbfunc.predict(ref.loss_fn, ref.params, ref.buffers, batch), batch
        )
    kept = S.kept_tokens(own.losses - base.losses, own.mask, keep, sbrandom.key(0))
    kind = batch["kind"][:, None].expand_as(own.mask)
    return torch.stack(
        [torch.bincount(kind[m], minlength=len(KINDS)).float() for m in (kept, own.mask)]
    )


def run_methods(
    cfg: Config, seed: int, stream: str, wanted: list[tuple[str, float]], cache_dir: Path
) -> list[Row]:
    """Run ``wanted`` ``(method, lr)`` pairs of one seed and stream in lockstep, one step
    each in turn; cached results are read instead."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    paths = {w: cache_dir / f"{cache_key(cfg, seed, stream, *w)}.json" for w in wanted}
    todo = [w for w in wanted if not paths[w].exists()]
    if todo:
        for run in _train(cfg, seed, stream, todo, cache_dir):
            paths[(run.name, run.lr)].write_text(json.dumps(_row(cfg, seed, stream, run)))
    return [json.loads(paths[w].read_text()) for w in wanted]


def _train(
    cfg: Config, seed: int, stream: str, todo: list[tuple[str, float]], cache_dir: Path
) -> list[Run]:
    data = load_data(cfg, seed)
    methods = [METHODS[name] for name, _ in todo]
    needed = {m.reference for m in methods if m.reference is not None}
    refs = {name: cached_reference(cfg, seed, name, data, cache_dir)[0] for name in needed}
    rows = without_kind(data.stream_rows[stream])
    tables = {
        m.reference: S.reference_losses(*refs[m.reference], rows, per="row")
        for m in methods
        if m.reference is not None and m.table
    }
    runs = [
        Run(cfg, name, lr, seed, refs.get(m.reference or ""), tables.get(m.reference or ""))
        for (name, lr), m in zip(todo, methods, strict=True)
    ]
    for i, batch in enumerate(data.batches[stream]):
        for run in runs:
            if i % cfg.eval_every == 0 and i <= run.steps:
                run.evaluate(cfg, i, data.heldout, batch)
            if i < run.steps:
                run.advance(batch)
        if (i + 1) % 50 == 0:
            print(f"seed {seed} {stream}: step {i + 1}/{cfg.steps}", flush=True)
    for run in runs:
        if run.curve[-1][0] != run.steps:
            loss = heldout_loss(run.loss_fn, run.state.params, run.state.buffers, data.heldout)
            run.curve.append((run.steps, loss))
    return runs


def _row(cfg: Config, seed: int, stream: str, run: Run) -> Row:
    tokens = cfg.batch * (cfg.seq_len - 1)
    kept = (run.kept_rows / run.seen_rows.clamp(min=1)).tolist()
    if run.keep_at is not None:  # token selection's kept tokens, measured at the evaluations
        kept = (run.token_kinds[0] / run.token_kinds[1].clamp(min=1)).tolist()
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
    rows = all_tuning_rows(cfg, stream, cache_dir)
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
    """The tuning runs on seed 0 (cached), for ``tune_lrs`` and the report."""
    wanted = [(name, lr) for name in TUNED for lr in cfg.lrs]
    return run_methods(cfg, cfg.seeds[0], stream, wanted, cache_dir)


def reference_infos(cfg: Config, cache_dir: Path) -> list[Row]:
    """What every reference of every seed is (trained and cached if it is not yet)."""
    return [
        cached_reference(cfg, seed, name, load_data(cfg, seed), cache_dir)[1]
        for seed in cfg.seeds
        for name in REFERENCES
    ]
