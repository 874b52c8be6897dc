"""Time to accuracy of Selective Backprop policies on MNIST-1D, with and without label noise.

Trains a small 1-D CNN (torchopt adam) on MNIST-1D generated offline, with plain training and
with :class:`sbfunc.SelectiveBackprop` running each policy of :mod:`sbfunc.policies`, at 0% and
20% symmetric label noise, for several seeds. Runs are interleaved seed-major (seed -> noise ->
method, the method order rotated per seed) so machine noise spreads over every method. Every
method gets the same budget in epochs (the same loader batches); scoring forwards count in the
forward samples. Per run it records wall time (training only, evaluation excluded), forward and
backpropagated samples, final and best test accuracy, the wall time to reach the plain run's
final accuracy (same seed and noise) and the share of backpropagated rows that were mislabelled
(counted on ``AFTER_LOSS`` by sample id). Writes ``time_to_accuracy.{md,csv,png}``.

Jiang et al.'s ``jiang_cdf`` runs twice: refilled to a fixed backprop batch with the
``SelectiveBackprop(refill=...)`` (the kept rows wait in a :class:`sbfunc.policies.Queue`; a
step trains once a full batch is queued, and a loader batch that leaves none makes no update),
and per batch with a
variable size inside ``SelectiveBackprop`` (``jiang_var``). RHO-LOSS reads irreducible losses
precomputed per sample id by a model trained on a held-out split (with the same label noise);
that model's training is reported separately, not charged to RHO-LOSS's wall time.

Run: ``python benchmarks/time_to_accuracy.py`` (about 15-20 minutes on 2 CPU cores; writes
``docs/results/``) or ``--quick`` (about a minute; writes to a temporary folder).
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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
import torchopt
from torch import nn
from tqdm.auto import tqdm

import sbfunc
from sbfunc import policies as P
from sbfunc import random as sbrandom

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _tta_report import write_outputs


@dataclass(frozen=True)
class Config:
    """Study sizes; ``FULL`` is the committed run, ``QUICK`` a smoke run."""

    num_samples: int = 16000  # generated: 80% train part (train + holdout), 20% test
    train: int = 10000
    holdout: int = 2800
    epochs: int = 10
    batch: int = 256
    width: int = 32
    lr: float = 5e-3
    keep: float = 0.5
    start: float = 0.1  # SB window [start, 1): a short plain warm-up
    evals_per_epoch: int = 3
    il_epochs: int = 25
    seeds: tuple[int, ...] = (0, 1, 2)
    noises: tuple[float, ...] = (0.0, 0.2)


FULL = Config()
QUICK = Config(num_samples=3000, train=2000, holdout=400, epochs=3, batch=128, width=32,
               evals_per_epoch=2, il_epochs=5, seeds=(0,))  # fmt: skip

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (x, y, sample ids)


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
    c = width
    return nn.Sequential(
        nn.Conv1d(1, c, 5, padding=2), nn.ReLU(),
        nn.Conv1d(c, c, 5, stride=2, padding=2), nn.ReLU(),
        nn.Conv1d(c, c, 5, stride=2, padding=2), nn.ReLU(),
        nn.Flatten(), nn.Linear(c * 10, 10),
    )  # fmt: skip


class Audit(sbfunc.Algorithm):
    """Counts, on ``AFTER_LOSS``, the backpropagated rows whose label was flipped (by id)."""

    def __init__(self, mislabelled: torch.Tensor) -> None:
        self.mislabelled = mislabelled

    def init(self, key: Any) -> torch.Tensor:
        return torch.zeros((), dtype=torch.int64)

    def match(self, event: sbfunc.Event, state: sbfunc.State) -> bool:
        return event == sbfunc.Event.AFTER_LOSS

    def apply(self, event: sbfunc.Event, state: sbfunc.State) -> sbfunc.State:
        hits = self.mislabelled.index_select(0, state.batch[2]).sum()  # stays a tensor
        counts = {**state.algorithm_state, self.name: state.algorithm_state[self.name] + hits}
        return state.replace(algorithm_state=counts)


class Setting(NamedTuple):
    """What a method needs to build its algorithms for one (seed, noise)."""

    cfg: Config
    loss_fn: sbfunc.ModuleLoss
    grad_norm_fn: sbfunc.ModuleLoss
    irreducible: torch.Tensor


def _sb(
    s: Setting, policy: P.Policy, loss_fn: sbfunc.ModuleLoss | None = None, refill: bool = False
) -> list[Any]:
    fn = s.loss_fn if loss_fn is None else loss_fn
    b = s.cfg.batch  # refill: queue the kept rows into full batches of the loader's size
    like = (
        torch.zeros(b, 1, 40),
        torch.zeros(b, dtype=torch.int64),
        torch.zeros(b, dtype=torch.int64),
    )
    sb = sbfunc.SelectiveBackprop(
        s.cfg.start, 1.0, interrupt=0, loss_fn=fn, policy=policy, ids=2,
        refill=like if refill else None,
    )  # fmt: skip
    return [sb]


METHODS: dict[str, Callable[[Setting], list[Any]]] = {
    "plain": lambda s: [],
    "rank_power": lambda s: _sb(s, P.rank_power_policy(s.cfg.keep)),
    "top_k": lambda s: _sb(s, P.top_k_policy(s.cfg.keep)),
    "random": lambda s: _sb(s, P.random_policy(s.cfg.keep)),
    "jiang_cdf": lambda s: _sb(s, P.jiang_cdf(1.0), refill=True),
    "jiang_var": lambda s: _sb(s, P.jiang_cdf(1.0)),
    "stale_sb": lambda s: _sb(s, P.stale_sb(1.0, num_ids=s.cfg.train, max_age=2)),
    "loshchilov": lambda s: _sb(s, P.loshchilov(100.0, s.cfg.keep, num_ids=s.cfg.train)),
    "grad_norm": lambda s: _sb(s, P.grad_norm_importance(s.cfg.keep), s.grad_norm_fn),
    "rho_loss": lambda s: _sb(s, P.rho_loss(s.cfg.keep, s.irreducible)),
    "infobatch": lambda s: _sb(s, P.infobatch(0.5, 0.875, num_ids=s.cfg.train)),
}


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
    loss_fn: sbfunc.ModuleLoss, state: sbfunc.State, x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    with torch.no_grad():
        logits = loss_fn.forward(state.params, state.buffers, (x, y))
        return (logits.argmax(1) == y).float().mean()


Curve = list[tuple[float, float, int, int, torch.Tensor]]  # wall, cpu, fwd, bwd, accuracy


def train(
    advance: Callable[[sbfunc.State, Batch], sbfunc.State],
    state: sbfunc.State,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    cfg: Config,
    epochs: int,
    key: sbrandom.Key,
    evaluate: Callable[[sbfunc.State], torch.Tensor] | None = None,
    desc: str = "",
) -> tuple[sbfunc.State, Curve, float]:
    """The loop: ``elapsed`` and ``epoch`` set per loader batch (so a refill loop that takes a
    variable number of optimizer steps sees the same schedule); evaluation is untimed. Returns
    the state, the curve (its last point holds the totals) and the training wall time."""
    per_epoch = x.shape[0] // cfg.batch
    total, every = epochs * per_epoch, max(1, per_epoch // cfg.evals_per_epoch)
    wall, cpu, done, curve = 0.0, 0.0, 0, []
    clock = (time.perf_counter(), time.process_time())

    def pause(evaluating: bool) -> None:
        nonlocal wall, cpu, clock
        wall += time.perf_counter() - clock[0]
        cpu += time.process_time() - clock[1]
        if evaluate is not None and evaluating:
            t = state.time
            curve.append(
                (wall, cpu, t.samples_forwarded, t.samples_backpropagated, evaluate(state))
            )
        clock = (time.perf_counter(), time.process_time())

    pause(True)
    bar = tqdm(total=total, desc=desc, leave=False, unit="batch", mininterval=0.5)
    for epoch in range(epochs):
        for batch in sbfunc.datasets.batches(x, y, cfg.batch, key=sbrandom.fold_in(key, epoch)):
            t = state.time._replace(epoch=epoch, batch_in_epoch=done % per_epoch)
            state = advance(state.replace(time=t._replace(elapsed=done / total)), batch)
            done += 1
            if done % every == 0 and done < total:
                pause(True)
        bar.update(per_epoch)
    pause(True)
    bar.close()
    return state, curve, wall


def fresh_state(
    params: dict, buffers: dict, opt: Any, algorithms: list[Any], seed: int
) -> sbfunc.State:
    p = {k: v.clone() for k, v in params.items()}
    key = sbrandom.key(seed)
    return sbfunc.init_state(p, buffers, key=key, opt_state=opt.init(p), algorithms=algorithms)


def irreducible_losses(
    model: nn.Module, params: dict, buffers: dict, d: Data, y_hold: torch.Tensor,
    y_train: torch.Tensor, cfg: Config, seed: int,
) -> tuple[torch.Tensor, dict[str, float]]:  # fmt: skip
    """RHO-LOSS's irreducible loss per training id: a model trained on the (noisy) holdout."""
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, train=True)
    opt = torchopt.adam(cfg.lr)
    step = sbfunc.make_train_step(loss_fn, opt)
    state = fresh_state(params, buffers, opt, [], seed)
    il_cfg = replace(cfg, batch=min(cfg.batch, d.x_hold.shape[0] // 4))
    state, _, wall = train(
        _plain_advance(step), state, d.x_hold, y_hold, cfg=il_cfg, epochs=cfg.il_epochs,
        key=sbrandom.key(10_000 + seed), desc="IL model",
    )  # fmt: skip
    eval_fn = loss_fn.with_train(False)
    scored = sbfunc.score_losses(eval_fn, state.params, state.buffers, (d.x, y_train))
    acc = float(accuracy(eval_fn, state, d.x_test, d.y_test))
    return scored, {"wall_s": wall, "test_acc": acc}


def one_run(
    method: str, setting: Setting, data: tuple[torch.Tensor, torch.Tensor], flipped: torch.Tensor,
    init: tuple[dict, dict], seed: int, noise: float, key: sbrandom.Key, d: Data,
) -> Run:  # fmt: skip
    """Train one method from the shared initial weights and summarise the run."""
    cfg, loss_fn = setting.cfg, setting.loss_fn
    eval_fn = loss_fn.with_train(False)
    audit, opt = Audit(flipped), torchopt.adam(cfg.lr)
    algorithms = [*METHODS[method](setting), audit]
    step = sbfunc.make_train_step(loss_fn, opt, algorithms)
    state, curve, _ = train(
        _plain_advance(step), fresh_state(*init, opt, algorithms, seed), *data, cfg=cfg,
        epochs=cfg.epochs, key=key, evaluate=lambda s: accuracy(eval_fn, s, d.x_test, d.y_test),
        desc=f"{method} s{seed} n{noise:.0%}",
    )  # fmt: skip
    t = state.time
    accs = [float(c[4]) for c in curve]  # the host reads accuracies once, after the run
    mislabelled = int(state.algorithm_state[audit.name])
    wall, cpu = curve[-1][0], curve[-1][1]
    points = [(w, c, f, b, a) for (w, c, f, b, _), a in zip(curve, accs, strict=True)]
    return Run(
        method, noise, seed, wall, cpu, t.samples_forwarded, t.samples_backpropagated, accs[-1],
        max(accs), mislabelled / max(1, t.samples_backpropagated), curve=points,
    )  # fmt: skip


def run_study(cfg: Config, methods: list[str]) -> tuple[list[Run], list[dict[str, Any]]]:
    t0 = time.perf_counter()
    d = load_data(cfg)
    print(f"mnist1d: {d.x.shape[0]} train, {d.x_hold.shape[0]} holdout, {d.x_test.shape[0]} "
          f"test (generated in {time.perf_counter() - t0:.1f}s)")  # fmt: skip
    model = make_model(cfg.width)
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, train=True)
    grad_norm_fn = sbfunc.per_sample_loss(model, P.logit_grad_norm)
    runs: list[Run] = []
    il_notes: list[dict[str, Any]] = []
    bar = tqdm(total=len(cfg.seeds) * len(cfg.noises) * len(methods), desc="runs", unit="run")
    for si, seed in enumerate(cfg.seeds):
        torch.manual_seed(seed)  # nn.Module init reads the global RNG: same init for all methods
        init = sbfunc.split_module(make_model(cfg.width), clone=True)
        order = methods[si % len(methods) :] + methods[: si % len(methods)]
        for noise in cfg.noises:
            k = sbrandom.fold_in(sbrandom.key(seed), round(noise * 1000))
            noisy = sbfunc.datasets.with_label_noise
            y, flipped = noisy(d.y, noise, 10, key=sbrandom.fold_in(k, 1))
            y_hold, _ = noisy(d.y_hold, noise, 10, key=sbrandom.fold_in(k, 2))
            irreducible = torch.zeros(cfg.train)
            if "rho_loss" in methods:
                irreducible, note = irreducible_losses(model, *init, d, y_hold, y, cfg, seed)
                il_notes.append({"seed": seed, "noise": noise, **note})
            setting = Setting(cfg, loss_fn, grad_norm_fn, irreducible)
            for method in order:
                run = one_run(
                    method, setting, (d.x, y), flipped, init, seed, noise,
                    sbrandom.fold_in(k, 3), d,
                )  # fmt: skip
                runs.append(run)
                bar.update(1)
                bar.set_postfix(
                    method=method, acc=f"{run.final_acc:.3f}", wall=f"{run.wall_s:.1f}s"
                )
    bar.close()
    return score_targets(runs), il_notes


def _plain_advance(step: sbfunc.TrainStep) -> Callable[[sbfunc.State, Batch], sbfunc.State]:
    return lambda s, b: step(s, b)[0]


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny smoke run (about a minute)")
    parser.add_argument("--out", type=Path, default=None, help="output folder")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--seeds", type=int, default=None, help="number of seeds")
    parser.add_argument("--epochs", type=int, default=None, help="override the epochs")
    parser.add_argument("--width", type=int, default=None, help="override the CNN width")
    parser.add_argument("--lr", type=float, default=None, help="override the learning rate")
    args = parser.parse_args()
    torch.set_num_threads(2)
    cfg = QUICK if args.quick else FULL
    if args.seeds is not None:
        cfg = replace(cfg, seeds=tuple(range(args.seeds)))
    for name in ("epochs", "width", "lr"):
        if getattr(args, name) is not None:
            cfg = replace(cfg, **{name: getattr(args, name)})
    methods = ["plain", *[m for m in args.methods if m != "plain"]]
    quick_out = Path(tempfile.gettempdir()) / "sbfunc_tta_quick"
    out = args.out or (quick_out if args.quick else Path("docs/results"))
    start = time.perf_counter()
    runs, il_notes = run_study(cfg, methods)
    total = time.perf_counter() - start
    command = " ".join(["python benchmarks/time_to_accuracy.py", *sys.argv[1:]])
    paths = write_outputs(
        out, runs=[asdict(r) for r in runs], il_notes=il_notes, config=asdict(cfg),
        total_s=total, command=command,
    )  # fmt: skip
    print(f"total {total / 60:.1f} min; wrote " + ", ".join(str(p) for p in paths))


if __name__ == "__main__":
    main()
