"""Quickstart: Selective Backprop against plain training on MNIST-1D, in wall-clock time.

Generates MNIST-1D procedurally (nothing is downloaded) and trains the same CNN twice with
``sbfunc.make_train_step``: plainly, and with ``sbfunc.SelectiveBackprop`` (keep half of every
batch). Both use Adam with a cosine learning rate decayed to
zero, from the same initial weights on the same batches. The two runs advance **interleaved,
one epoch each in turn** (plain, SB, plain, SB, ...), so a burst of load on the machine hits
both alike; the script prints the per-epoch time ratio as a median with its spread, the test
accuracy of both, and when SB reached plain's final accuracy. Saves a plot outside the
repository (the temporary directory unless ``--plot PATH`` says where) and prints its path.

Run: ``python examples/quickstart.py`` (``--fast`` for a smoke run; ``--plot PATH`` for the
plot, ``--plot ''`` for none; the script prints its training wall time).
"""

from __future__ import annotations

import os

# A shared machine: busy-waiting OpenMP threads stall whenever another process holds a core.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import sbfunc

BATCH = 256
WIDTH = 128


def make_model(width: int = WIDTH) -> nn.Module:
    """The time-to-accuracy study's CNN, wider: most of its step is per-sample compute (the
    regime SB is meant for); the adaptive-pooling head (the identity at full length) also
    accepts downsampled scoring inputs."""
    c = width
    return nn.Sequential(
        nn.Conv1d(1, c, 5, padding=2), nn.ReLU(),
        nn.Conv1d(c, c, 5, stride=2, padding=2), nn.ReLU(),
        nn.Conv1d(c, c, 5, stride=2, padding=2), nn.ReLU(),
        nn.Conv1d(c, c, 5, padding=2), nn.ReLU(),
        nn.AdaptiveAvgPool1d(10), nn.Flatten(), nn.Linear(c * 10, 10),
    )  # fmt: skip


class Run:
    """One training run, advanced an epoch at a time."""

    def __init__(self, data: sbfunc.datasets.Split, epochs: int, selective: bool) -> None:
        torch.manual_seed(0)  # the same initial weights for both runs
        self.model = make_model()
        params, buffers = sbfunc.split_module(self.model, clone=True)
        loss_fn = sbfunc.per_sample_loss(self.model, F.cross_entropy, mode="train")
        algorithms = []
        if selective:  # active from 10% of training on
            sb = sbfunc.SelectiveBackprop(start=0.1, end=1.0, keep=0.5, interrupt=0)
            algorithms.append(sb)
        self.steps_per_epoch = data.x_train.shape[0] // BATCH
        lr = sbfunc.optim.cosine_decay_schedule(3e-3, epochs * self.steps_per_epoch)
        self.step = sbfunc.make_train_step(loss_fn, sbfunc.optim.adam(lr), algorithms)
        self.key = sbfunc.random.key(0)
        self.state = self.step.init(params, buffers, key=self.key)
        self.data, self.epochs, self.epoch_times, self.records = data, epochs, [], []

    def batches(self, epoch: int) -> Any:  # a fresh shuffle per epoch, from an explicit key
        k = sbfunc.random.fold_in(self.key, epoch)
        return sbfunc.datasets.batches(self.data.x_train, self.data.y_train, BATCH, key=k)

    def warm_up(self) -> None:
        """One step on a throwaway state, in and out of SB's window (first calls are slow)."""
        x, y = self.data.x_train[:BATCH], self.data.y_train[:BATCH]
        s = self.state
        for elapsed in (0.0, 0.5):  # a throwaway state, set in and out of SB's window
            t = s.time._replace(elapsed=elapsed, total_steps=self.epochs * self.steps_per_epoch)
            s = self.step(s._replace(time=t), (x, y))[0]

    def epoch(self, epoch: int) -> None:
        t0 = time.perf_counter()
        self.state = sbfunc.fit(
            self.step, self.state, self.batches, epochs=self.epochs,
            steps_per_epoch=self.steps_per_epoch, stop_after=(epoch + 1) * self.steps_per_epoch,
            progress=False, history=False,
        ).state  # fmt: skip
        self.epoch_times.append(time.perf_counter() - t0)
        with torch.no_grad():  # untimed evaluation
            logits = sbfunc.predict(
                self.model, self.state.params, self.state.buffers, self.data.x_test
            )
        t = self.state.time
        self.records.append({
            "wall": sum(self.epoch_times), "backpropagated": t.samples_backpropagated,
            "forwarded": t.samples_forwarded,
            "accuracy": float((logits.argmax(1) == self.data.y_test).float().mean()),
        })  # fmt: skip


def plot(runs: dict[str, Run], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for name, run in runs.items():
        acc = [r["accuracy"] for r in run.records]
        axes[0].plot([r["wall"] for r in run.records], acc, marker="o", label=name)
        axes[1].plot([r["backpropagated"] for r in run.records], acc, marker="o", label=name)
    axes[0].set_xlabel("training wall time (s)")
    axes[1].set_xlabel("backpropagated samples")
    axes[0].set_ylabel("test accuracy")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("MNIST-1D CNN: plain vs Selective Backprop (interleaved epochs)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="a tiny smoke run")
    parser.add_argument(
        "--plot",
        default=str(Path(tempfile.gettempdir()) / "sbfunc-quickstart.png"),
        help="where to save the plot ('' for no plot; default: the temporary directory)",
    )
    args = parser.parse_args()
    torch.set_num_threads(2)
    data = sbfunc.datasets.mnist1d(600 if args.fast else 4000)
    epochs = 2 if args.fast else 8
    runs = {"plain": Run(data, epochs, False), "selective backprop": Run(data, epochs, True)}
    for run in runs.values():
        run.warm_up()
    for epoch in range(epochs):  # interleaved: plain, SB, plain, SB, ...
        for run in runs.values():
            run.epoch(epoch)
    plain, sb = runs["plain"], runs["selective backprop"]
    forwarded = "forwarded (scoring + training)"  # SB's scoring forward counts too
    print(f"{'run':<20}{'test acc':>10}{'wall (s)':>10}{forwarded:>32}{'backprop':>10}")
    for name, run in runs.items():
        r = run.records[-1]
        print(f"{name:<20}{r['accuracy']:>10.3f}{r['wall']:>10.1f}"
              f"{r['forwarded']:>32,d}{r['backpropagated']:>10,d}")  # fmt: skip
    # SB is active from 10% of training: compare the epochs where it selects on every batch
    active = range(1, epochs) if epochs > 1 else range(epochs)
    ratios = [plain.epoch_times[e] / sb.epoch_times[e] for e in active]
    target = plain.records[-1]["accuracy"]
    hit = next((r["wall"] for r in sb.records if r["accuracy"] >= target), None)
    spread = f"[{min(ratios):.2f}-{max(ratios):.2f}]"
    print(f"\nepoch time, plain / SB: {statistics.median(ratios):.2f}x median over "
          f"{len(ratios)} interleaved epoch pairs {spread}")  # fmt: skip
    if hit is None:
        print("SB did not reach plain's final accuracy within the same epochs.")
    else:
        print(f"SB reached plain's final accuracy ({target:.3f}) after {hit:.1f}s: "
              f"{hit / plain.records[-1]['wall']:.2f}x plain's training time.")  # fmt: skip
    print(
        "Whether SB saves wall time depends on the regime: the share of a step that shrinks "
        "with the rows\nand the cost of the scoring forward (docs/how-to/scoring.md; the "
        "study in docs/results/\ntime_to_accuracy.md measures both)."
    )
    if args.plot:
        path = Path(args.plot)
        path.parent.mkdir(parents=True, exist_ok=True)
        plot(runs, path)
        print(f"plot: {path}")


if __name__ == "__main__":
    main()
