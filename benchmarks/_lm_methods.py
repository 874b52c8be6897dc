"""The language-model study's references and methods (``language_model.py``)."""

from __future__ import annotations

import fcntl
import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict
from itertools import islice
from pathlib import Path
from typing import Any, NamedTuple

import torch
from _lm_data import (
    Config,
    Data,
    Row,
    epochs,
    heldout_loss,
    lm_loss,
    optimizer,
    outside_rows,
)

import sbfunc
from sbfunc import random as sbrandom
from sbfunc import selective_backprop as S


def cache_key(cfg: Config, *parts: Any) -> str:
    """A cached result's name: the study's sizes (seeds aside) and ``parts``."""
    blob = json.dumps([asdict(cfg) | {"seeds": None}, *parts], sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------- references
class Reference(NamedTuple):
    loss_fn: sbfunc.module.ModuleLoss
    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]


class RefSpec(NamedTuple):
    """A reference model: issue 36's small one (``cfg.ref_layers`` x ``cfg.ref_width``) or one
    of the main model's size, trained on ``text`` times the clean split's rows (the split, then
    :func:`_lm_data.outside_rows`) for ``text * cfg.ref_steps`` steps: every reference makes
    the same number of passes over its text. ``label`` names its costs in the timing pass."""

    same_size: bool
    text: int
    label: str


REFERENCES = {
    "small": RefSpec(False, 1, "reference"),
    "same-size": RefSpec(True, 1, "same-size reference"),
    "same-size, 4x text": RefSpec(True, 4, "same-size reference"),
}


def reference_module(cfg: Config, seed: int, spec: RefSpec) -> torch.nn.Module:
    if spec.same_size:  # the main model's architecture (main_model), its own initial weights
        return sbfunc.models.CausalLM(max_len=cfg.seq_len, key=sbrandom.key(10_000 + seed))
    return sbfunc.models.CausalLM(
        d_model=cfg.ref_width,
        num_heads=max(1, cfg.ref_width // 32),
        num_layers=cfg.ref_layers,
        max_len=cfg.seq_len,
        key=sbrandom.key(10_000 + seed),
    )


def reference_steps(cfg: Config, spec: RefSpec) -> int:
    return spec.text * cfg.ref_steps


def reference_text(cfg: Config, data: Data, spec: RefSpec) -> dict[str, torch.Tensor]:
    """The clean rows a reference trains on: the seed's reference split, and for ``text > 1``
    ``text - 1`` times as many rows from files outside the study's corpus."""
    if spec.text == 1:
        return data.reference
    extra = outside_rows(cfg, (spec.text - 1) * len(data.reference["ids"]))
    return {k: torch.cat([v, extra[k]]) for k, v in data.reference.items()}


def train_reference(cfg: Config, seed: int, data: Data, spec: RefSpec) -> Reference:
    """A reference trained on its clean text (the main runs' recipe, at ``cfg.ref_lr``)."""
    model = reference_module(cfg, seed, spec)
    loss_fn = lm_loss(model)
    steps = reference_steps(cfg, spec)
    step = sbfunc.make_train_step(loss_fn, optimizer(cfg.ref_lr, steps, cfg.warmup))
    params, buffers = sbfunc.split_module(model, clone=True)
    state = step.init(params, buffers, key=sbrandom.key(seed))
    for batch in islice(epochs(reference_text(cfg, data, spec), cfg.batch, seed), steps):
        state, _ = step(state, batch)
    return Reference(loss_fn, state.params, state.buffers)


def cached_reference(
    cfg: Config, seed: int, name: str, data: Data, cache_dir: Path
) -> tuple[Reference, Row]:
    """The seed's reference ``name`` (:data:`REFERENCES`) and what it is (size, text, steps,
    its held-out loss: a measurement, nothing is chosen by it), trained once and cached; a
    lock lets the other stream's process wait for it instead of training it twice."""
    spec = REFERENCES[name]
    cache_dir.mkdir(parents=True, exist_ok=True)
    stem = cache_dir / f"ref-{cache_key(cfg, seed, name)}"
    weights, info_path = stem.with_suffix(".pt"), stem.with_suffix(".json")
    with open(stem.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not info_path.exists():
            ref = train_reference(cfg, seed, data, spec)
            torch.save({"params": ref.params, "buffers": ref.buffers}, weights)
            info = {
                "reference": name,
                "seed": seed,
                "parameters": sum(v.numel() for v in ref.params.values()),
                "rows": len(reference_text(cfg, data, spec)["ids"]),
                "steps": reference_steps(cfg, spec),
                "heldout": heldout_loss(*ref, data.heldout),
            }
            info_path.write_text(json.dumps(info))
    saved = torch.load(weights, weights_only=True)
    loss_fn = lm_loss(reference_module(cfg, seed, spec))
    return Reference(loss_fn, saved["params"], saved["buffers"]), json.loads(info_path.read_text())


# ----------------------------------------------------------------------------- methods
Algorithms = Callable[[Config, Reference | None, torch.Tensor | None], list[sbfunc.Algorithm]]
KeepAt = Callable[[Config, Any], Any]


class Method(NamedTuple):
    """One run's recipe: its algorithms, the rows of each batch it trains on (``None``: all),
    its budget as a fraction of the steps, whose tuned learning rate it takes, the reference
    it scores with (:data:`REFERENCES`), whether it reads that reference's per-row table of
    the stream, and, for token selection by excess loss, its kept fraction at a fraction of
    the run (to measure which kinds of tokens it keeps)."""

    algorithms: Algorithms
    rows: Callable[[Config], int | None]
    budget: float = 1.0
    lr_of: str = "selective LM"
    reference: str | None = None
    table: bool = False
    keep_at: KeepAt | None = None


def _none(cfg: Config, ref: Reference | None, table: torch.Tensor | None) -> list[Any]:
    return []


def _all(cfg: Config) -> int | None:
    return None


def fixed_keep(cfg: Config, elapsed: Any) -> Any:
    return cfg.keep


def rising_keep(cfg: Config, elapsed: Any) -> Any:
    """Linear from ``cfg.keep`` at the start to 1 at the end of the run (``elapsed`` a float,
    or a 0-d tensor inside a step), chosen before any run: every token by the end, where the
    learning rate has decayed and each dropped code token is a lost update."""
    return cfg.keep + (1.0 - cfg.keep) * elapsed


def _token_selection(reference: str, keep_at: KeepAt) -> Method:
    def algorithms(cfg: Config, ref: Reference | None, table: torch.Tensor | None) -> list[Any]:
        assert ref is not None
        keep = cfg.keep if keep_at is fixed_keep else lambda elapsed: keep_at(cfg, elapsed)
        return [S.TokenSelection(keep, reference=S.reference_model(*ref))]

    return Method(algorithms, _all, reference=reference, keep_at=keep_at)


def _rho_loss(reference: str) -> Method:
    def algorithms(cfg: Config, ref: Reference | None, table: torch.Tensor | None) -> list[Any]:
        assert table is not None
        policy = sbfunc.policies.rho_loss(cfg.keep, table)
        return [
            sbfunc.SelectiveBackprop(start=0.0, end=1.0, interrupt=0, ids="ids", policy=policy)
        ]

    return Method(algorithms, _all, reference=reference, table=True)


def _uniform_tokens(cfg: Config, ref: Reference | None, table: torch.Tensor | None) -> list[Any]:
    return [S.TokenSelection(cfg.keep, score="uniform")]


METHODS: dict[str, Method] = {
    "plain": Method(_none, _all, lr_of="plain"),
    "plain, 0.7x budget": Method(_none, _all, budget=0.7, lr_of="plain"),
    "uniform tokens": Method(_uniform_tokens, _all),
    "uniform sequences": Method(_none, lambda cfg: int(cfg.keep * cfg.batch)),
    "selective LM": _token_selection("small", fixed_keep),
    "RHO-LOSS sequences": _rho_loss("small"),
    # issue 40: a reference of the main model's size (Rho-1's), on 1x and 4x the clean text
    "selective LM, same-size reference": _token_selection("same-size", fixed_keep),
    "selective LM, same-size reference, 4x text": _token_selection(
        "same-size, 4x text", fixed_keep
    ),
    "selective LM, same-size reference, keep 0.6 to 1": _token_selection("same-size", rising_keep),
    "RHO-LOSS sequences, same-size reference": _rho_loss("same-size"),
}
TUNED = ("plain", "selective LM")
# issue 36's sequence-level methods ran on the mixed stream only (they filter off-target
# rows); issue 40's rows run on both streams, to see what each costs where there is no junk
NEW = tuple(list(METHODS)[6:])
ON_CLEAN = ("plain", "plain, 0.7x budget", "uniform tokens", "selective LM", *NEW)


def charges(cfg: Config, name: str, steps: int) -> list[tuple[str, int]]:
    """The costs a run of ``steps`` steps of method ``name`` pays besides its own steps, as
    ``(timing entry, count)``: its reference's training and, with a table, its forward over
    every batch used."""
    method = METHODS[name]
    if method.reference is None:
        return []
    spec = REFERENCES[method.reference]
    out = [(f"{spec.label} training step", reference_steps(cfg, spec))]
    if method.table:
        out.append((f"{spec.label} forward (table)", steps))
    return out
