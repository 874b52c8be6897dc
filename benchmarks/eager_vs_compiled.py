"""Eager and compiled Selective Backprop steps, side by side from the same state: where they part.

Not a timing benchmark: it measures how far ``torch.compile(step)`` drifts from the eager step
when both train from the same initial state on the same batches with the same keys. A small
residual 1-D CNN with BatchNorm (ResNet-8-like) trains on MNIST-1D with Selective Backprop
selecting on every step (keep half). Each step prints:

* ``update``: the largest parameter change the eager step made (the scale of a step);
* ``max |dp|``: the largest difference between the two runs' parameters after the step;
* ``one-step``: the largest difference between the compiled step's result and the eager step
  run *from the compiled run's own state* (what one step contributes: rounding only);
* ``kept``: whether the two runs kept the same rows (the first step where they differ is a
  *selection flip*: near-tied scores, reordered by rounding, pick different rows);
* ``one-step kept``: whether the compiled step kept the rows the eager step keeps from the
  same state (a flip caused by that step's rounding alone).

At the end: the step of the first flip, how many steps flipped, and the test accuracy of both
runs (``sbfunc.predict``, eval mode).

Run: ``python benchmarks/eager_vs_compiled.py`` (``--optimizer sgd`` for SGD with momentum;
``--steps``, ``--width``; a few minutes on 2 CPU cores, most of it compiling).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import sbfunc
from sbfunc.engine import Algorithm, Context, Event

BATCH = 128
KEEP = 0.5


class Block(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv1d(c, c, 3, padding=1), nn.BatchNorm1d(c), nn.ReLU(),
            nn.Conv1d(c, c, 3, padding=1), nn.BatchNorm1d(c),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.body(x))


def make_model(width: int) -> nn.Module:
    """Stem, three residual blocks (the middle one after a stride-2 conv), pooled head."""
    c = width
    return nn.Sequential(
        nn.Conv1d(1, c, 3, padding=1), nn.BatchNorm1d(c), nn.ReLU(),
        Block(c), nn.Conv1d(c, c, 3, stride=2, padding=1), Block(c), Block(c),
        nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(c, 10),
    )  # fmt: skip


class KeptIds(Algorithm):
    """Records the ids of the rows that reach the forward (after selection) in its state."""

    uses_key = False
    events = frozenset({Event.BEFORE_FORWARD})

    def init(self, key: Any) -> torch.Tensor:
        return torch.full((int(BATCH * KEEP),), -1)

    def match(self, event: Event, state: Context) -> bool:
        return event == Event.BEFORE_FORWARD

    def apply(self, event: Event, state: Context) -> Context:
        return state.replace(own=state.batch[2])


def build_step(model: nn.Module, total_steps: int, optimizer: str) -> Any:
    """The step under test: SB (selecting on every step) + the recorder, Adam or SGD with
    momentum, cosine LR. The only place that builds a step, so an API change touches only
    this function."""
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    sb = sbfunc.SelectiveBackprop(start=0.0, end=1.0, keep=KEEP, interrupt=0)  # the step's loss
    if optimizer == "adam":
        opt = sbfunc.optim.adam(sbfunc.optim.cosine_decay_schedule(3e-3, total_steps))
    else:
        opt = sbfunc.optim.sgd(sbfunc.optim.cosine_decay_schedule(0.05, total_steps), momentum=0.9)
    return sbfunc.make_train_step(loss_fn, opt, [sb, KeptIds()])


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def accuracy(model: nn.Module, state: Any, data: Any) -> float:
    logits = sbfunc.predict(model, state.params, state.buffers, data.x_test)
    return float((logits.argmax(1) == data.y_test).float().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=93, help="training steps (3 epochs)")
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data = sbfunc.datasets.mnist1d(5000)
    torch.manual_seed(0)
    model = make_model(args.width)
    eager = build_step(model, args.steps, args.optimizer)
    compiled = torch.compile(build_step(model, args.steps, args.optimizer))
    params, buffers = sbfunc.split_module(model, clone=True)
    init = eager.init(params, buffers, key=sbfunc.random.key(0), total_steps=args.steps)
    per_epoch = data.x_train.shape[0] // BATCH

    def batch(i: int) -> Any:
        key = sbfunc.random.fold_in(sbfunc.random.key(1), i // per_epoch)
        return list(sbfunc.datasets.batches(data.x_train, data.y_train, BATCH, key=key))[
            i % per_epoch
        ]

    t0 = time.perf_counter()
    compiled(init, batch(0))  # compile outside the loop (its result is discarded)
    print(f"compiled the step in {time.perf_counter() - t0:.1f}s (first call)")
    a, b = init, init  # eager, compiled
    first_flip, flips, one_step_flips = None, 0, 0
    print(f"{'step':>4}{'update':>11}{'max |dp|':>11}{'one-step':>11}  {'kept':<10}one-step")
    for i in range(args.steps):
        x = batch(i)
        before, a = a, eager(a, x)[0]
        shadow = eager(b, x)[0]  # the eager step from the compiled run's state
        b = compiled(b, x)[0]
        kept_b = b.algorithm_state[1]
        same = bool(torch.equal(a.algorithm_state[1], kept_b))
        same_one = bool(torch.equal(shadow.algorithm_state[1], kept_b))
        flips += not same
        one_step_flips += not same_one
        if not same and first_flip is None:
            first_flip = i
        one = max_diff(shadow.params, b.params)
        update, apart = max_diff(before.params, a.params), max_diff(a.params, b.params)
        words = ("same" if same else "DIFFERENT", "same" if same_one else "DIFFERENT")
        print(f"{i:>4}{update:>11.2e}{apart:>11.2e}{one:>11.2e}  {words[0]:<10}{words[1]}")
    print(f"\nfirst selection flip at step {first_flip}; after it the runs are apart: "
          f"{flips} of {args.steps} steps kept different rows")  # fmt: skip
    print(f"one step from the same state: {one_step_flips} of {args.steps} compiled steps kept "
          f"other rows than the eager step would have")  # fmt: skip
    print(f"test accuracy: eager {accuracy(model, a, data):.3f}, "
          f"compiled {accuracy(model, b, data):.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
