"""Time to accuracy of Selective Backprop policies on MNIST-1D, with and without label noise.

Trains a 1-D CNN whose step is dominated by per-sample compute (width 96, four convolutions,
an adaptive-pooling head; see the regime table it prints) on MNIST-1D generated
offline, with plain training and with :class:`sbfunc.SelectiveBackprop` running the policies
of :mod:`sbfunc.policies`, at 0% and 20% symmetric label noise, for several seeds. Every method:

* trains through its :func:`sbfunc.make_train_step`, compiled with ``step.compile()`` (one step
  per method, shared by every seed and noise level: the per-run data, the label-noise mask
  and RHO-LOSS's irreducible losses enter through the state, so nothing recompiles; compile
  time is reported apart and excluded, every step is warmed up on a throwaway state first,
  and once more after every step is compiled; the report counts the graphs compiled during
  the timed runs);
* uses Adam with a cosine learning rate decayed to zero over the run, plain included (Kaddour
  et al. 2023: the gains of SB-like methods vanish against an undertuned baseline);
* gets the same budget in epochs (the same loader batches, in the same order per seed, under
  the default protocol) from the same initial weights.

Runs go seed-major (seed -> noise), and within one seed and noise every method's run
advances **interleaved, one evaluation interval (half an epoch) each in turn** (the method
order rotated per seed), so a burst of load or the machine's drift falls on every method
alike: runs timed one after the other differed by more than SB saves (issue 28). Per run it
records training wall time (evaluation excluded), forward and backpropagated samples, final
and best test accuracy, the wall time to reach the plain run's final accuracy (same seed and
noise) and the share of backpropagated rows that were mislabelled. Before the runs it
measures the regime in one interleaved loop: ``T_full`` (a plain step), ``T_kept`` (a plain
step on the kept fraction), ``T_score`` (the scoring forward) and ``T_sb`` (an SB step), and
the ideal ``T_full / (T_score + T_kept)``. A whole run's ratio to plain is checked against
what its steps predict from inside the runs: the median ratio of paired chunks (chunk ``i``
of each run ran side by side) wholly inside SB's window. Writes
``time_to_accuracy.{md,csv,png}``.

``--protocol equal-backprop`` (issue 37; ``_tta_protocol.py``) runs the papers' protocol
instead of the default ``equal-candidates``: plain trains on batches of ``batch`` rows, each
selecting method loads ``candidate_batch_size(batch, keep)`` candidates a step and
backpropagates about ``batch``; the budget is still the same epochs over the training set
(a selecting method takes about ``keep`` times plain's steps, its cosine schedule decaying to
zero at its own step count), the runs still advance interleaved half an epoch each in turn,
and the outputs are ``time_to_accuracy_equal_backprop.{md,csv,png}``, so the committed
results stay. The whole-run prediction is not measured there (the runs' chunks do not pair).

Run: ``python benchmarks/time_to_accuracy.py`` (about 30 minutes on 2 CPU cores; writes
``docs/results/``) or ``--quick`` (a few minutes; writes to a temporary folder; ``--eager``
skips compiling, a smoke run).
"""

from __future__ import annotations

import os

# The machine is shared: with busy-waiting OpenMP threads, a 2-thread team stalls whenever
# another process holds one of the 2 cores (10x outliers); passive waiting degrades gracefully.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import math
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch._dynamo
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

import sbfunc
from sbfunc import policies as P
from sbfunc import random as sbrandom

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _tta_methods import TTA_METHODS, Audit, head_features, methods, with_run_tables
from _tta_protocol import EQUAL_CANDIDATES, PROTOCOLS, method_config, output_stem
from _tta_regime import measure_regime
from _tta_report import write_outputs
from _tta_train import (
    Curve,
    Trainer,
    build,
    eval_stops,
    graphs_compiled,
    interleave,
    rehearse,
    train,
    training,
    warm_up,
)


@dataclass(frozen=True)
class Config:
    """Study sizes; ``FULL`` is the committed run, ``QUICK`` a smoke run."""

    num_samples: int = 20000  # generated: 80% train part (train + holdout), 20% test
    train: int = 8000
    holdout: int = 8000  # as large as the training set: RHO-LOSS's irreducible-loss model
    epochs: int = 8
    batch: int = 256
    width: int = 96
    lr: float = 3e-3
    keep: float = 0.5
    start: float = 0.1  # SB window [start, 1): a short plain warm-up
    evals_per_epoch: int = 2
    il_epochs: int = 15
    seeds: tuple[int, ...] = (0, 1, 2)
    noises: tuple[float, ...] = (0.0, 0.2)


FULL = Config()
QUICK = Config(num_samples=2500, train=1024, holdout=512, epochs=2, batch=128, width=32,
               evals_per_epoch=1, il_epochs=3, seeds=(0,))  # fmt: skip


class Data(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor
    x_hold: torch.Tensor
    y_hold: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


def load_data(cfg: Config) -> Data:
    s = sbfunc.datasets.mnist1d(cfg.num_samples, seed=42)
    n, h = cfg.train, cfg.holdout
    if n + h > s.x_train.shape[0]:
        raise ValueError(f"train + holdout = {n + h} exceeds the {s.x_train.shape[0]} generated")
    xs, ys = s.x_train, s.y_train
    return Data(xs[:n], ys[:n], xs[n : n + h], ys[n : n + h], s.x_test, s.y_test)


def make_model(width: int) -> nn.Module:
    """Four convolutions and an adaptive-pooling head (10 positions: the identity at full
    length, so the head keeps positions, which MNIST-1D needs); any input length fits, so
    downsampled scoring (``scale_factor < 1``) works."""
    c = width
    return nn.Sequential(
        nn.Conv1d(1, c, 5, padding=2), nn.ReLU(),
        nn.Conv1d(c, c, 5, stride=2, padding=2), nn.ReLU(),
        nn.Conv1d(c, c, 5, stride=2, padding=2), nn.ReLU(),
        nn.Conv1d(c, c, 5, padding=2), nn.ReLU(),
        nn.AdaptiveAvgPool1d(10), nn.Flatten(), nn.Linear(head_features(c), 10),
    )  # fmt: skip


@dataclass
class Run:
    method: str
    noise: float
    seed: int
    wall_s: float
    cpu_s: float
    forward_samples: int
    backprop_samples: int
    final_acc: float
    best_acc: float
    mislabelled_share: float
    time_to_target_s: float = math.nan  # filled in against the plain run
    target_ratio: float = math.nan  # time_to_target_s / plain wall time
    cpu_target_ratio: float = math.nan  # the same in process CPU time
    curve: list[tuple[float, float, int, int, float]] = field(default_factory=list, repr=False)


def accuracy(
    eval_fn: sbfunc.module.ModuleLoss, params: dict, buffers: dict, d: Data
) -> torch.Tensor:
    with torch.no_grad():
        logits = eval_fn.forward(params, buffers, (d.x_test, d.y_test))
    return (logits.argmax(1) == d.y_test).float().mean()


def irreducible_losses(
    cfg: Config, trainer: Trainer, loss_fn: sbfunc.module.ModuleLoss, init: tuple[dict, dict],
    d: Data,
    y_hold: torch.Tensor, y_train: torch.Tensor, seed: int,
) -> tuple[torch.Tensor, dict[str, float]]:  # fmt: skip
    """RHO-LOSS's irreducible loss per training id: the same CNN trained on the (noisy)
    holdout with the same cosine schedule, scored in eval mode on the training labels."""
    state = trainer.step.init(*init, key=sbrandom.key(seed))
    state, curve = train(trainer, state, d.x_hold, y_hold, cfg=cfg, epochs=cfg.il_epochs,
                         key=sbrandom.key(10_000 + seed))  # fmt: skip
    eval_fn = loss_fn.with_mode("eval")
    scored = sbfunc.score.score_losses(eval_fn, state.params, state.buffers, (d.x, y_train))
    acc = float(accuracy(eval_fn, state.params, state.buffers, d))
    return scored, {"wall_s": curve[-1][0], "test_acc": acc}


def one_run(method: str, trainer: Trainer, init: tuple[dict, dict], x: torch.Tensor,
            y: torch.Tensor, flipped: torch.Tensor, irreducible: torch.Tensor, *, cfg: Config,
            seed: int, noise: float, key: sbrandom.Key, d: Data,
            eval_fn: sbfunc.module.ModuleLoss) -> Iterator[Run]:  # fmt: skip
    """Train one method from the shared initial weights, a chunk per ``next`` (see
    :func:`training`); its last value summarises the run (run it alone with
    ``interleave([one_run(...)])[0]``)."""
    state = trainer.step.init(*init, key=sbrandom.fold_in(key, 7))
    own = list(state.algorithm_state)
    own[-1] = (own[-1][0], flipped.to(torch.int64))  # the audit's mask for this run
    own[0] = with_run_tables(method, own[0], irreducible)
    state = state._replace(algorithm_state=tuple(own))
    chunks = training(trainer, state, x, y, cfg=cfg, epochs=cfg.epochs, key=key,
                      evaluate=lambda s: accuracy(eval_fn, s.params, s.buffers, d))  # fmt: skip
    for state, curve in chunks:
        yield _summary(method, state, curve, seed, noise)


def _summary(method: str, state: sbfunc.TrainState, curve: Curve, seed: int,
             noise: float) -> Run:  # fmt: skip
    t = state.time
    accs = [float(c[4]) for c in curve]  # the host reads accuracies after the chunk
    mislabelled = int(state.algorithm_state[-1][0])
    points = [(w, c, f, b, a) for (w, c, f, b, _), a in zip(curve, accs, strict=True)]
    return Run(
        method, noise, seed, curve[-1][0], curve[-1][1], t.samples_forwarded,
        t.samples_backpropagated, accs[-1], max(accs),
        mislabelled / max(1, t.samples_backpropagated), curve=points,
    )  # fmt: skip


class Setup(NamedTuple):
    """What every run of a study shares: the data, the losses and the template weights."""

    d: Data
    loss_fn: sbfunc.module.ModuleLoss
    grad_norm_fn: sbfunc.module.ModuleLoss  # the logit-gradient norm, grad_norm's score
    init0: tuple[dict, dict]


def setup(cfg: Config) -> Setup:
    t0 = time.perf_counter()
    d = load_data(cfg)
    print(f"mnist1d: {d.x.shape[0]} train, {d.x_hold.shape[0]} holdout, {d.x_test.shape[0]} "
          f"test (generated in {time.perf_counter() - t0:.1f}s)")  # fmt: skip
    torch.manual_seed(0)
    model = make_model(cfg.width)
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    grad_norm_fn = sbfunc.per_sample_loss(model, P.logit_grad_norm)
    return Setup(d, loss_fn, grad_norm_fn, sbfunc.split_module(model, clone=True))


def compile_method(cfg: Config, s: Setup, algorithms: list[Any], *,
                   compile: bool = True) -> Trainer:  # fmt: skip
    """A method's trainer (its algorithms and the audit), warmed up when compiled."""
    steps = cfg.epochs * (cfg.train // cfg.batch)
    trainer = build(cfg, [*algorithms, Audit(cfg.train)], s.loss_fn, steps, compile=compile)
    return warm_up(trainer, s.init0, s.d.x, s.d.y, cfg) if compile else trainer


def il_trainer(cfg: Config, s: Setup, *, compile: bool = True) -> tuple[Config, Trainer]:
    """The irreducible-loss model's config and trainer (plain, on the holdout)."""
    il_cfg = replace(cfg, batch=min(cfg.batch, cfg.holdout // 8))
    il_steps = cfg.il_epochs * (cfg.holdout // il_cfg.batch)
    il = build(il_cfg, [], s.loss_fn, il_steps, compile=compile)
    return il_cfg, (warm_up(il, s.init0, s.d.x_hold, s.d.y_hold, il_cfg) if compile else il)


def seed_init(cfg: Config, seed: int) -> tuple[dict, dict]:
    """The initial weights of every method for ``seed``."""
    torch.manual_seed(seed)  # nn.Module init reads the global RNG: same init for all methods
    return sbfunc.split_module(make_model(cfg.width), clone=True)


class Episode(NamedTuple):
    """One seed and noise level: labels, flipped mask, irreducible losses, loader key."""

    y: torch.Tensor
    flipped: torch.Tensor
    irreducible: torch.Tensor  # zeros when the irreducible-loss model is not trained
    key: sbrandom.Key


def episode(cfg: Config, s: Setup, il: tuple[Config, Trainer] | None,
            init: tuple[dict, dict], seed: int, noise: float,
            notes: list[dict[str, Any]]) -> Episode:  # fmt: skip
    """Make the run's noisy labels and, with ``il``, the irreducible losses (noted in
    ``notes``, which this appends to)."""
    k = sbrandom.fold_in(sbrandom.key(seed), round(noise * 1000))
    noisy = sbfunc.datasets.with_label_noise
    y, flipped = noisy(s.d.y, noise, 10, key=sbrandom.fold_in(k, 1))
    y_hold, _ = noisy(s.d.y_hold, noise, 10, key=sbrandom.fold_in(k, 2))
    irreducible = torch.zeros(cfg.train)
    if il is not None:
        irreducible, note = irreducible_losses(il[0], il[1], s.loss_fn, init, s.d, y_hold, y,
                                               seed)  # fmt: skip
        notes.append({"seed": seed, "noise": noise, **note})
    return Episode(y, flipped, irreducible, sbrandom.fold_in(k, 3))


def like(d: Data, n: int) -> tuple[torch.Tensor, ...]:
    """A batch of ``n`` training rows shaped as the loader's ``(x, y, ids)``."""
    return d.x[:n], d.y[:n], torch.arange(n)


class Study(NamedTuple):
    """What :func:`run_study`'s runs share, from :func:`prepare`."""

    s: Setup
    cfgs: dict[str, Config]  # each method's config: its loader batch
    trainers: dict[str, Trainer]
    il: tuple[Config, Trainer] | None  # RHO-LOSS's irreducible-loss model, when it runs
    notes: dict[str, Any]


def prepare(cfg: Config, names: list[str], protocol: str, *, compile: bool = True) -> Study:
    """The shared setup, each method's config (its loader batch under ``protocol``) and
    trainer (compiled, warmed up and rehearsed; eager with ``compile=False``), the
    irreducible-loss model, and the notes: protocol, loader batches, compile times, the regime
    and the chunks (``stops``, ``None`` when the methods' chunks differ)."""
    s = setup(cfg)
    cfgs = {name: method_config(cfg, name, protocol) for name in names}
    table = methods(cfg, s.loss_fn, s.grad_norm_fn)
    trainers = {name: compile_method(cfgs[name], s, table[name](), compile=compile)
                for name in tqdm(names, desc="compile", unit="step")}  # fmt: skip
    il = il_trainer(cfg, s, compile=compile) if "rho_loss" in names else None
    trainers = rehearse(trainers, cfgs, s.init0, s.d.x, s.d.y) if compile else trainers
    candidates = method_config(cfg, "rank_power", protocol).batch  # the regime's SB steps
    regime = measure_regime(s.loss_fn, trainers, s.init0, like(s.d, cfg.batch), cfg.keep,
                            candidates=like(s.d, candidates), compile=compile)  # fmt: skip
    notes: dict[str, Any] = {
        "protocol": protocol,
        "loader_batch": {k: c.batch for k, c in cfgs.items()},
        "compile_s": {k: round(v.compile_s, 1) for k, v in trainers.items()},
        "regime": regime,
        "stops": eval_stops(cfg, cfg.epochs, cfg.train // cfg.batch)  # the runs' chunks
        if protocol == EQUAL_CANDIDATES else None,
        "il": [],
    }  # fmt: skip
    return Study(s, cfgs, trainers, il, notes)


def run_study(cfg: Config, names: list[str], protocol: str = EQUAL_CANDIDATES, *,
              compile: bool = True) -> tuple[list[Run], dict[str, Any]]:  # fmt: skip
    """Every method's runs under ``protocol``, seed-major (seed -> noise; within one, the
    methods interleaved half an epoch each in turn, the order rotated per seed), scored
    against plain's final accuracy, and the notes (see :func:`prepare`; ``graphs_in_runs``
    counts the graphs compiled during the runs, the irreducible-loss models' included)."""
    st = prepare(cfg, names, protocol, compile=compile)
    runs: list[Run] = []
    eval_fn = st.s.loss_fn.with_mode("eval")
    bar = tqdm(total=len(cfg.seeds) * len(cfg.noises) * len(names), desc="runs", unit="run")
    before = graphs_compiled()
    for si, seed in enumerate(cfg.seeds):
        init = seed_init(cfg, seed)
        order = names[si % len(names) :] + names[: si % len(names)]
        for noise in cfg.noises:
            e = episode(cfg, st.s, st.il, init, seed, noise, st.notes["il"])
            runs += interleave([
                one_run(method, st.trainers[method], init, st.s.d.x, e.y, e.flipped,
                        e.irreducible, cfg=st.cfgs[method], seed=seed, noise=noise, key=e.key,
                        d=st.s.d, eval_fn=eval_fn)
                for method in order
            ])  # fmt: skip
            bar.update(len(order))
    bar.close()
    st.notes["graphs_in_runs"] = graphs_compiled() - before
    return score_targets(runs), st.notes


def score_targets(runs: list[Run]) -> list[Run]:
    """Time for each run to reach the final accuracy of the plain run of its seed and noise."""
    plain = {(r.seed, r.noise): r for r in runs if r.method == "plain"}
    for r in runs:
        ref = plain.get((r.seed, r.noise))
        if ref is None:
            continue
        hit = next(((w, c) for w, c, _, _, a in r.curve if a >= ref.final_acc), None)
        if hit is not None:
            r.time_to_target_s, r.target_ratio = hit[0], hit[0] / ref.wall_s
            r.cpu_target_ratio = hit[1] / ref.cpu_s
    return runs


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny smoke run")
    parser.add_argument("--eager", action="store_true", help="eager steps (a smoke run)")
    parser.add_argument("--out", type=Path, default=None, help="output folder")
    names = list(methods(QUICK, None, None))  # type: ignore[arg-type]
    parser.add_argument("--methods", nargs="+", default=list(TTA_METHODS), choices=names)
    parser.add_argument("--protocol", choices=PROTOCOLS, default=EQUAL_CANDIDATES,
                        help="equal-candidates: every method loads batch rows a step; "
                        "equal-backprop: plain loads batch, a selecting method "
                        "batch / keep and backpropagates batch")  # fmt: skip
    parser.add_argument("--seeds", type=int, default=None, help="number of seeds")
    parser.add_argument("--epochs", type=int, default=None, help="override the epochs")
    parser.add_argument("--width", type=int, default=None, help="override the CNN width")
    parser.add_argument("--noises", type=float, nargs="+", default=None, help="label noises")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (>= 1)")
    args = parser.parse_args()
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    return args


def config(args: argparse.Namespace) -> Config:
    """The study's config: ``QUICK`` or ``FULL`` with the command line's overrides."""
    cfg = QUICK if args.quick else FULL
    if args.seeds is not None:
        cfg = replace(cfg, seeds=tuple(range(args.seeds)))
    if args.noises is not None:
        cfg = replace(cfg, noises=tuple(args.noises))
    for name in ("epochs", "width"):
        if getattr(args, name) is not None:
            cfg = replace(cfg, **{name: getattr(args, name)})
    return cfg


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    # each TrainStep has its own code objects, but frames below the steps (graph breaks in
    # the scoring and irreducible-loss functions) are shared by every method and shape: raise
    # dynamo's recompile limits so none falls back to eager
    torch._dynamo.config.recompile_limit = 256
    torch._dynamo.config.accumulated_recompile_limit = 4096
    cfg = config(args)
    chosen = ["plain", *[m for m in args.methods if m != "plain"]]
    quick_out = Path(tempfile.gettempdir()) / "sbfunc_tta_quick"
    out = args.out or (quick_out if args.quick else Path("docs/results"))
    start = time.perf_counter()
    runs, notes = run_study(cfg, chosen, args.protocol, compile=not args.eager)
    total = time.perf_counter() - start
    command = " ".join(["python benchmarks/time_to_accuracy.py", *sys.argv[1:]])
    paths = write_outputs(out, runs=[asdict(r) for r in runs], notes=notes, config=asdict(cfg),
                          total_s=total, command=command,
                          stem=output_stem("time_to_accuracy", args.protocol))  # fmt: skip
    print(f"total {total / 60:.1f} min; wrote " + ", ".join(str(p) for p in paths))


if __name__ == "__main__":
    main()
