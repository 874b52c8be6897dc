"""Quickstart: when selective backprop wins. Loshchilov selection against plain training.

The regime: MNIST-1D (generated offline, nothing is downloaded; clean labels), a 1-D CNN of
width 128 whose step is mostly per-sample compute, batch 256, 8 epochs on 8,000 samples: long
enough for the accuracy to level off (about 94% test accuracy). The selective run
is ``sbfunc.SelectiveBackprop`` with Loshchilov & Hutter's rule (``policies.loshchilov``):
from 10% of training on it backpropagates half of every batch, drawn with a preference for
high-loss samples, and ranks samples by the loss recorded when they were last trained on, so
only the rows whose loss is unknown or two epochs old need an extra scoring forward.

Both runs use ``sbfunc.make_train_step`` with Adam and a cosine learning rate decayed to zero,
from the same initial weights on the same batches, for the **same number of epochs**: both
schedules finish, the accuracies are the same whatever the load on the machine (a step budget
set from a measured step-time ratio would move with the load), and wall time is what the two
are compared on. The runs advance **interleaved, half an epoch each in turn**, so a burst of
load hits both alike; the untimed test evaluations between chunks draw the accuracy against
wall-time curves. The script prints each run's final accuracy and wall time, when each first
reached plain's final accuracy, where selection does not help, and saves the plot outside the
repository: a new file of a unique name in the temporary directory (two runs at once never
overwrite each other's), unless ``--plot PATH`` says where.

Run: ``python examples/quickstart.py`` (about 1.5 minutes on 2 CPU cores; ``--fast`` for a
smoke run of a few seconds; ``--plot ''`` for no plot).
"""

from __future__ import annotations

import os

# A shared machine: busy-waiting OpenMP threads stall whenever another process holds a core.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

import sbfunc
from sbfunc import policies

KEEP = 0.5  # the share of every batch that selection backpropagates


class Config(NamedTuple):
    """Sizes: ``FULL`` for the example, ``FAST`` for a smoke run."""

    samples: int  # generated: 80% training set, 20% test set
    batch: int
    epochs: int
    width: int  # the CNN's channels
    evals_per_epoch: int


FULL = Config(samples=10000, batch=256, epochs=8, width=128, evals_per_epoch=2)
FAST = Config(samples=1000, batch=64, epochs=2, width=16, evals_per_epoch=1)
BATCH, WIDTH = FULL.batch, FULL.width  # the example's CNN, as the benchmarks import it


def make_model(width: int = WIDTH) -> nn.Module:
    """Four convolutions and an adaptive-pooling head (the time-to-accuracy study's CNN)."""
    c = width
    return nn.Sequential(
        nn.Conv1d(1, c, 5, padding=2), nn.ReLU(),
        nn.Conv1d(c, c, 5, stride=2, padding=2), nn.ReLU(),
        nn.Conv1d(c, c, 5, stride=2, padding=2), nn.ReLU(),
        nn.Conv1d(c, c, 5, padding=2), nn.ReLU(),
        nn.AdaptiveAvgPool1d(10), nn.Flatten(), nn.Linear(c * 10, 10),
    )  # fmt: skip


class Run:
    """One training run on ``(x, y)``, advanced a chunk of steps at a time; ``wall`` counts
    training time only (evaluation excluded)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, *, batch: int, epochs: int, width: int,
                 algorithms: list[Any]) -> None:  # fmt: skip
        torch.manual_seed(0)  # the same initial weights for both runs
        self.model = make_model(width)
        params, buffers = sbfunc.split_module(self.model, clone=True)
        loss_fn = sbfunc.per_sample_loss(self.model, F.cross_entropy, mode="train")
        self.steps_per_epoch = x.shape[0] // batch
        self.total = epochs * self.steps_per_epoch
        lr = sbfunc.optim.cosine_decay_schedule(3e-3, self.total)
        self.step = sbfunc.make_train_step(loss_fn, sbfunc.optim.adam(lr), algorithms)
        self.key = sbfunc.random.key(0)
        self.state = self.step.init(params, buffers, key=self.key, total_steps=self.total)
        self.x, self.y, self.batch, self.epochs, self.wall = x, y, batch, epochs, 0.0
        self.curve: list[tuple[float, float]] = []  # (wall time, test accuracy)

    def batches(self, epoch: int) -> Any:  # a fresh shuffle per epoch, from an explicit key
        k = sbfunc.random.fold_in(self.key, epoch)
        return sbfunc.datasets.batches(self.x, self.y, self.batch, key=k)  # (x, y, ids)

    def warm_up(self) -> None:
        """Steps on a throwaway state in and out of selection's window (first calls are slow)."""
        b = self.batch
        batch = (self.x[:b], self.y[:b], torch.arange(b))
        for elapsed in (0.0, 0.5):
            t = self.state.time._replace(elapsed=elapsed)
            self.step(self.state._replace(time=t), batch)

    def advance(self, stop: int) -> None:
        """Train up to step ``stop`` (of ``self.total``), timed."""
        t0 = time.perf_counter()
        self.state = sbfunc.fit(
            self.step, self.state, self.batches, epochs=self.epochs,
            steps_per_epoch=self.steps_per_epoch, stop_after=stop, progress=False, history=False,
        ).state  # fmt: skip
        self.wall += time.perf_counter() - t0

    def evaluate(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Test accuracy now (untimed), appended to the curve."""
        with torch.no_grad():
            logits = sbfunc.predict(self.model, self.state.params, self.state.buffers, x)
        self.curve.append((self.wall, float((logits.argmax(1) == y).float().mean())))


def train_both(data: sbfunc.datasets.Split, cfg: Config) -> tuple[Run, Run]:
    """Plain and selective training, interleaved a chunk of steps at a time."""
    n = data.x_train.shape[0]
    policy = policies.loshchilov(s_e=100.0, keep=KEEP, num_ids=n, max_age=2)
    sb = sbfunc.SelectiveBackprop(start=0.1, end=1.0, interrupt=0, policy=policy, ids=2)
    kw: dict[str, Any] = {"batch": cfg.batch, "epochs": cfg.epochs, "width": cfg.width}
    plain = Run(data.x_train, data.y_train, algorithms=[], **kw)
    selective = Run(data.x_train, data.y_train, algorithms=[sb], **kw)
    chunk = max(1, plain.steps_per_epoch // cfg.evals_per_epoch)
    for run in (plain, selective):
        run.warm_up()
    for stop in [*range(chunk, plain.total, chunk), plain.total]:
        for run in (plain, selective):  # interleaved: plain, selective, plain, ...
            run.advance(stop)
            run.evaluate(data.x_test, data.y_test)
    return plain, selective


def first_reach(run: Run, target: float) -> float | None:
    """The wall time of the first evaluation at or above ``target``, if any."""
    return next((w for w, acc in run.curve if acc >= target), None)


def accuracy_at(run: Run, wall: float) -> float:
    """The test accuracy of the last evaluation within ``wall`` seconds of training (0 before
    the first)."""
    return next((acc for w, acc in reversed(run.curve) if w <= wall), 0.0)


def report(plain: Run, selective: Run, cfg: Config, n: int) -> None:
    print(f"regime: MNIST-1D ({n:,d} training samples, clean labels), CNN width {cfg.width}, "
          f"batch {cfg.batch}, Adam + cosine to zero, {cfg.epochs} epochs each; selection: "
          f"Loshchilov, {KEEP:.0%} of each batch")  # fmt: skip
    target = plain.curve[-1][1]
    head = f"{'run':<12}{'test acc':>10}{'wall (s)':>10}{'forwarded':>11}{'backprop':>10}"
    print(f"{head}  time to plain's final accuracy")
    for name, run in (("plain", plain), ("selective", selective)):
        hit, t = first_reach(run, target), run.state.time
        reach = "not reached" if hit is None else f"{hit:.1f}s ({hit / plain.wall:.2f}x plain)"
        print(f"{name:<12}{run.curve[-1][1]:>10.3f}{run.wall:>10.1f}"
              f"{t.samples_forwarded:>11,d}{t.samples_backpropagated:>10,d}  {reach}")  # fmt: skip
    print(f"whole run, selective / plain wall time: {selective.wall / plain.wall:.2f}x")
    budget = min(selective.wall, plain.wall)  # the same wall-clock budget for both
    print(f"at the same wall-clock budget ({budget:.1f}s): plain "
          f"{accuracy_at(plain, budget):.3f}, selective {accuracy_at(selective, budget):.3f} "
          "test accuracy")  # fmt: skip
    print("Where selection does not help (docs/results/time_to_accuracy.md): with 20% label "
          "noise this\nrule backpropagates the flipped labels and ends below plain (85.6% vs "
          "89.3%; RHO-LOSS gets\n92.2% but needs a holdout split and a reference model); on a "
          "narrower CNN (width 96) the\ngain shrinks to 0.77-0.88x; a run stopped before "
          "accuracy levels off compares only its start.")  # fmt: skip


def plot(runs: dict[str, Run], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, run in runs.items():
        ax.plot(*zip(*run.curve, strict=True), marker="o", label=name)
    ax.set_xlabel("training wall time (s)")
    ax.set_ylabel("test accuracy")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("MNIST-1D CNN: plain vs Selective Backprop (Loshchilov)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def unique_plot_path() -> Path:
    """A new, empty file in the temporary directory whose name no other run gets."""
    fd, name = tempfile.mkstemp(prefix="sbfunc-quickstart-", suffix=".png")
    os.close(fd)
    return Path(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="a tiny smoke run")
    parser.add_argument(
        "--plot",
        default=None,
        help="where to save the plot ('' for no plot; default: a new, uniquely named file in "
        "the temporary directory)",
    )
    args = parser.parse_args()
    torch.set_num_threads(2)
    cfg = FAST if args.fast else FULL
    t0 = time.perf_counter()
    data = sbfunc.datasets.mnist1d(cfg.samples)
    print(f"MNIST-1D generated in {time.perf_counter() - t0:.1f}s")
    plain, selective = train_both(data, cfg)
    report(plain, selective, cfg, data.x_train.shape[0])
    if args.plot != "":
        path = unique_plot_path() if args.plot is None else Path(args.plot)
        path.parent.mkdir(parents=True, exist_ok=True)
        plot({"plain": plain, "selective (Loshchilov)": selective}, path)
        print(f"plot: {path}")


if __name__ == "__main__":
    main()
