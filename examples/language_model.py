"""Selective language modeling (Rho-1) against plain training on the shipped text corpus.

A small byte-level causal LM (:class:`sbfunc.models.CausalLM`) trains on the Python standard
library's own sources (:func:`sbfunc.datasets.stdlib_corpus`: nothing is downloaded) and is
evaluated on held-out source files. Two training streams: a **mixed** one, where half of the
sequences are random bytes or English prose (the junk a crawl brings in), and the **clean**
corpus. On each, from the same initial weights over the same batches, with AdamW and a cosine
learning rate decayed to zero at the end (each run's own budget):

* ``plain``: every token of every batch;
* ``selective LM``: :class:`sbfunc.selective_backprop.TokenSelection` keeps the 60% of the
  batch's tokens with the highest *excess loss* (the model's loss minus a reference model's)
  and backpropagates only those; the reference is a smaller LM trained first on a clean 5%
  split, run frozen inside the step (``reference_model``);
* ``uniform tokens``: the same fraction dropped at random (``score="uniform"``), the control.

The runs advance interleaved, one step each in turn, so the machine's load falls on all alike.
The script prints each run's final held-out loss, the tokens and the time (the reference's
training and forward charged) at which it first reached plain's final loss, which tokens the
selection kept, and where it does not help.

Run: ``python examples/language_model.py`` (about 1.5 minutes on 2 CPU cores; ``--fast`` for
a smoke run of a few seconds).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import time
from itertools import islice
from typing import Any, NamedTuple

import torch

import sbfunc
from sbfunc import datasets, models
from sbfunc import random as sbrandom
from sbfunc import selective_backprop as sb

KEEP = 0.6  # the share of every batch's real tokens that selection backpropagates
KINDS = ("code", "random-byte", "English")


class Config(NamedTuple):
    """Sizes: ``FULL`` for the example, ``FAST`` for a smoke run."""

    seq_len: int
    batch: int
    steps: int
    width: int
    layers: int
    ref_steps: int
    eval_every: int
    eval_rows: int
    max_bytes: int


FULL = Config(
    seq_len=64,
    batch=32,
    steps=300,
    width=64,
    layers=2,
    ref_steps=150,
    eval_every=25,
    eval_rows=256,
    max_bytes=2 << 20,
)
FAST = Config(
    seq_len=32,
    batch=8,
    steps=8,
    width=16,
    layers=1,
    ref_steps=4,
    eval_every=4,
    eval_rows=16,
    max_bytes=200_000,
)


def lm(cfg: Config, width: int, layers: int, seed: int) -> sbfunc.module.ModuleLoss:
    """A causal LM and its per-sample loss over the real tokens of a dict batch."""
    model = models.CausalLM(
        d_model=width, num_heads=2, num_layers=layers, max_len=cfg.seq_len, key=sbrandom.key(seed)
    )
    return sbfunc.per_sample_loss(
        model,
        sbfunc.module.next_token_cross_entropy,
        input=("input_ids", "attention_mask"),
        target="labels",
    )


def adamw(lr: float, steps: int) -> sbfunc.optim.GradientTransformation:
    schedule = sbfunc.optim.warmup_cosine_decay_schedule(0.0, lr, max(1, steps // 20), steps)
    return sbfunc.optim.chain(
        sbfunc.optim.clip_by_global_norm(1.0),
        sbfunc.optim.adamw(schedule, b1=0.9, b2=0.95, weight_decay=0.1),
    )


def heldout_loss(loss_fn: sbfunc.module.ModuleLoss, state: Any, rows: dict) -> float:
    """The mean loss over every real held-out token (Hugging Face's objective), eval mode."""
    with torch.no_grad():
        tokens = loss_fn.elements(sbfunc.predict(loss_fn, state.params, state.buffers, rows), rows)
    return float(tokens.losses[tokens.mask].mean())


def train_reference(cfg: Config, rows: dict) -> tuple[sb.ModelReference, float]:
    """A smaller LM trained on the clean reference split; its training time in seconds."""
    loss_fn = lm(cfg, cfg.width // 2, 1, seed=1)
    step = sbfunc.make_train_step(loss_fn, adamw(3e-3, cfg.ref_steps))
    state = step.init(*sbfunc.split_module(loss_fn.module, clone=True), key=sbrandom.key(1))
    epochs = (
        batch
        for epoch in range(cfg.ref_steps)
        for batch in datasets.dict_batches(rows, cfg.batch, key=sbrandom.key(epoch))
    )
    t0 = time.perf_counter()
    for batch in islice(epochs, cfg.ref_steps):
        state, _ = step(state, batch)
    seconds = time.perf_counter() - t0
    return sb.reference_model(loss_fn, state.params, state.buffers), seconds


class Run(NamedTuple):
    """One method's run: its step, its state box and what it measured."""

    step: sbfunc.TrainStep
    curve: list[tuple[int, float, float]]  # (step, seconds so far, held-out loss)
    kinds: torch.Tensor  # [2, 3]: kept and real tokens per kind, at the evaluations


def kept_by_kind(run: Run, state: Any, reference: sb.ModelReference, batch: dict) -> torch.Tensor:
    """Which kinds of tokens the selection keeps in ``batch`` with the current weights."""
    own, ref = (
        loss_fn.elements(sbfunc.predict(loss_fn, params, buffers, batch), batch)
        for loss_fn, params, buffers in (
            (run.step.loss_fn, state.params, state.buffers),
            reference,
        )
    )
    kept = sb.kept_tokens(own.losses - ref.losses, own.mask, KEEP, sbrandom.key(0))
    kind = batch["kind"][:, None].expand_as(own.mask)
    return torch.stack([torch.bincount(kind[m], minlength=3).float() for m in (kept, own.mask)])


def train(
    cfg: Config, stream: dict, heldout: dict, reference: sb.ModelReference, ref_seconds: float
) -> dict[str, Run]:
    """plain, selective LM and uniform tokens, one step each in turn on the same batches."""
    algorithms = {
        "plain": [],
        "selective LM": [sb.TokenSelection(KEEP, reference=reference)],
        "uniform tokens": [sb.TokenSelection(KEEP, score="uniform")],
    }
    runs, states = {}, {}
    for name, algs in algorithms.items():
        loss_fn = lm(cfg, cfg.width, cfg.layers, seed=0)  # the same initial weights
        step = sbfunc.make_train_step(loss_fn, adamw(3e-3, cfg.steps), algs)
        states[name] = step.init(
            *sbfunc.split_module(loss_fn.module, clone=True),
            key=sbrandom.key(2),
            total_steps=cfg.steps,
        )
        start = ref_seconds if name == "selective LM" else 0.0  # the reference's training
        runs[name] = Run(
            step, [(0, start, heldout_loss(loss_fn, states[name], heldout))], torch.zeros(2, 3)
        )
    batches = datasets.dict_batches(stream, cfg.batch, key=sbrandom.key(3))
    for i, batch in enumerate(islice(batches, cfg.steps), start=1):
        for name, run in runs.items():
            t0 = time.perf_counter()
            states[name], metrics = run.step(states[name], batch)
            metrics.loss.item()  # wait for the step to finish (a no-op on the CPU)
            seconds = run.curve[-1][1] + time.perf_counter() - t0
            if i % cfg.eval_every == 0 or i == cfg.steps:
                if name == "selective LM" and "kind" in batch:
                    with torch.no_grad():
                        run.kinds.add_(kept_by_kind(run, states[name], reference, batch))
                run.curve.append(
                    (i, seconds, heldout_loss(run.step.loss_fn, states[name], heldout))
                )
            else:
                run.curve[-1] = (run.curve[-1][0], seconds, run.curve[-1][2])
    return runs


def reached(curve: list[tuple[int, float, float]], target: float) -> tuple[int, float] | None:
    """The first evaluation (step, seconds) at or below ``target``; ``None`` if none."""
    return next(((s, t) for s, t, loss in curve if loss <= target), None)


def report(stream: str, runs: dict[str, Run], steps: int) -> dict[str, float]:
    """Print one stream's table; return each run's final held-out loss."""
    plain = runs["plain"].curve[-1]
    print(
        f"\n{stream} stream: held-out loss (nats per byte) | tokens and time to plain's "
        f"final {plain[2]:.3f}"
    )
    for name, run in runs.items():
        hit = reached(run.curve, plain[2])
        when = (
            "never"
            if hit is None
            else f"{hit[0] / steps:.2f}x tokens, {hit[1] / plain[1]:.2f}x time"
        )
        print(f"  {name:15s} {run.curve[-1][2]:.3f} | {when}")
    kinds = runs["selective LM"].kinds
    if stream == "mixed" and kinds[1].sum() > 0:
        share = kinds[0] / kinds[1].clamp(min=1)
        print(
            "  selective LM kept "
            + ", ".join(
                f"{100 * float(f):.0f}% of the {k} tokens"
                for k, f in zip(KINDS, share, strict=True)
            )
        )
    return {name: run.curve[-1][2] for name, run in runs.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="a smoke run of a few seconds")
    cfg = FAST if parser.parse_args(argv).fast else FULL
    torch.manual_seed(0)  # nothing below draws from it: every draw takes a key
    corpus = datasets.stdlib_corpus(seq_len=cfg.seq_len, max_bytes=cfg.max_bytes)
    split = datasets.split_corpus(corpus, heldout=0.1, reference=0.05, key=sbrandom.key(0))
    heldout = {k: v[: cfg.eval_rows] for k, v in split.heldout.items()}
    mixed = datasets.mixed_stream(
        split.train,
        corpus.english,
        random_fraction=0.25,
        english_fraction=0.25,
        key=sbrandom.key(4),
    )
    print(
        f"corpus: {corpus.num_bytes:,} bytes of Python {corpus.python_version}'s standard "
        f"library (sha256 {corpus.digest[:12]}); {cfg.steps} steps of {cfg.batch} x "
        f"{cfg.seq_len} bytes"
    )
    reference, ref_seconds = train_reference(cfg, split.reference)
    finals = {}
    for stream, rows in (("mixed", mixed), ("clean", split.train)):
        runs = train(cfg, rows, heldout, reference, ref_seconds)
        finals[stream] = report(stream, runs, cfg.steps)
    where_not(finals)


def where_not(finals: dict[str, dict[str, float]]) -> None:
    """Say plainly where selective language modeling did not help in this run."""
    print("\nwhere it does not help:")
    for stream, f in finals.items():
        gap = f["selective LM"] - f["plain"]
        if gap > 0:
            print(f"  {stream} stream: selective LM ended {gap:.3f} nats worse than plain")
        control = f["selective LM"] - f["uniform tokens"]
        if control > -0.01:
            print(
                f"  {stream} stream: no better than dropping the same share of tokens at "
                f"random ({control:+.3f} nats)"
            )
    print(
        "  its step costs a plain step plus the reference's forward: it saves no compute, "
        "it only changes what the model learns from (docs/results/language_models.md)"
    )


if __name__ == "__main__":
    main()
