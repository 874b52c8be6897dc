"""The language-model study (issue 36): token and sequence selection on the shipped corpus.

A byte-level causal LM (:class:`sbfunc.models.CausalLM`, 644k parameters: 3 layers, width
128) trains on the Python standard library's sources (:func:`sbfunc.datasets.stdlib_corpus`,
sequences of 128 bytes, batch 32, 500 steps of AdamW, betas (0.9, 0.95), weight decay 0.1,
gradients clipped to norm 1, 20 warm-up steps and a cosine decay **to zero at each run's own
budget**: Kaddour et al. 2023's protocol). Two training streams: the clean corpus, and a mixed
stream where half of the sequences are replaced by random bytes (25%) or English prose from
``pydoc_data`` (25%). Every run is evaluated on the same held-out clean files (whole files the
training never sees). Methods, each through :func:`sbfunc.make_train_step`:

* ``plain``: every token; ``plain, 0.7x budget``: the same, its schedule decayed to zero at
  70% of the tokens (what a user with that budget would run);
* ``uniform tokens``: :class:`sbfunc.selective_backprop.TokenSelection` with
  ``score="uniform"`` (a random 60% of the real tokens backpropagated);
* ``uniform sequences``: a plain step on the first 60% of each (already random) batch: the
  dropped rows are never forwarded;
* ``selective LM``: ``TokenSelection(0.6)``, Rho-1's excess loss over a reference model (1
  layer, width 64, 75k parameters) trained for 300 steps on a clean 5% split of the corpus,
  run frozen inside the step (``reference_model``);
* ``RHO-LOSS sequences``: :class:`sbfunc.SelectiveBackprop` with ``rho_loss(0.6, table)``,
  the same reference's per-row losses computed once over the stream
  (``reference_losses(per="row")``).

Issue 40's rows give selective language modeling Rho-1's reference, one **of the main
model's size** (3 layers, width 128, its own initial weights), trained the same way:

* ``selective LM, same-size reference``: 300 steps on the clean 5% split;
* ``selective LM, same-size reference, 4x text``: 1200 steps on 4x the clean text: the split
  and three times as many rows from standard-library files **outside the study's corpus** (the
  files :func:`sbfunc.datasets.stdlib_corpus` would read next, by its sha256 order of paths: no
  text of the streams or the held-out files), so the same ~6 passes over its text;
* ``selective LM, same-size reference, keep 0.6 to 1``: the first, its kept fraction rising
  linearly from 0.6 at the start to 1 at the end (fixed before any run: every token by the end,
  where the learning rate has decayed);
* ``RHO-LOSS sequences, same-size reference``: RHO-LOSS with the first one's per-row table.

Issue 36's sequence-level methods run on the mixed stream only (they filter off-target rows;
the clean stream has none, and the study's time went to seeds instead); issue 40's rows run on
both streams, RHO-LOSS included, to show what each costs where there is nothing to filter.
They take the selective run's tuned learning rate; nothing of theirs is tuned.

The learning rate is tuned on seed 0 per stream over 1e-3 and 3e-3 for ``plain``
and for ``selective LM``; the selecting baselines take the selective one's, ``plain, 0.7x budget``
plain's. Within one seed and stream every method advances **in lockstep, one step each in
turn**, from the same initial weights over the same batches. "Tokens" counts the stream's
tokens drawn (every method draws the same batches). Wall-clock is charged from an interleaved
timing pass (one thread, under ``flock /tmp/sbfunc-timing.lock``, medians of paired rounds):
a run's time to a loss is its steps times its step's median plus its reference's training
(and, for the table, its forward over the rows used), over plain's whole run. Runs and
references are cached by their configuration (``--cache``), so an interrupted study resumes
and new methods train alone.

Run: ``python benchmarks/language_model.py`` (about three hours on 2 CPU cores: the two
streams can go in two processes with ``--streams mixed --no-report`` and ``--streams clean``;
writes ``docs/results/language_models.{md,csv,png}``) or ``--quick`` (a smoke run, a minute).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import sys
import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _lm_data import Config
from _lm_report import write_outputs
from _lm_runs import all_tuning_rows, reference_infos, run_group, tune_lrs
from _lm_timing import measure_steps

FULL = Config()
QUICK = Config(
    steps=12,
    batch=8,
    seq_len=64,
    eval_every=4,
    eval_rows=16,
    lrs=(1e-3, 3e-3),
    seeds=(0,),
    ref_steps=6,
    max_bytes=300_000,
    timing_repeats=3,
    warmup=2,
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (a minute)")
    parser.add_argument("--streams", nargs="+", default=["mixed", "clean"])
    parser.add_argument("--seeds", nargs="+", type=int, default=None)
    parser.add_argument("--no-report", action="store_true", help="train only (no timing)")
    parser.add_argument("--out", type=Path, default=None, help="default docs/results")
    parser.add_argument("--cache", type=Path, default=None, help="cached runs (resumable)")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    if args.seeds is not None:
        cfg = replace(cfg, seeds=tuple(args.seeds))
    scratch = Path(tempfile.gettempdir())
    out = args.out or (scratch / "sbfunc-lm-quick" if args.quick else _repo() / "docs/results")
    cache = args.cache or scratch / ("sbfunc-lm-quick-cache" if args.quick else "sbfunc-lm-cache")
    torch.set_num_threads(cfg.threads)
    runs: list[dict[str, Any]] = []
    lrs: dict[str, dict[str, float]] = {}
    for stream in args.streams:
        lrs[stream] = tune_lrs(cfg, stream, cache)
        for seed in cfg.seeds:
            runs += run_group(cfg, seed, stream, lrs[stream], cache)
    if args.no_report:
        return
    references = reference_infos(cfg, cache)
    timing = measure_steps(cfg, cache)
    command = "python benchmarks/language_model.py" + (" --quick" if args.quick else "")
    tuning = [r for stream in args.streams for r in all_tuning_rows(cfg, stream, cache)]
    written = write_outputs(
        out,
        runs=runs,
        tuning=tuning,
        references=references,
        lrs=lrs,
        timing=timing,
        config=asdict(cfg),
        command=command,
    )
    for path in written:
        print("wrote", path)
    print(json.dumps({"lrs": lrs}, indent=1))


def _repo() -> Path:
    return Path(__file__).resolve().parent.parent


if __name__ == "__main__":
    main()
