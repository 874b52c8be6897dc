"""JAX-style training: a pure step over an explicit state, with a ``sequence`` of algorithms.

Trains a small CNN on scikit-learn's bundled digits (nothing is downloaded) with
``sbfunc.make_train_step``, Selective Backprop, CutOut, and a ``sequence`` of MixUp (first half
of training only) and label smoothing. Along the way it shows the three things that make the
functional style worth it:

1. the engine's traces tell exactly which algorithm ran on which event, in which order;
2. the state is a value: checkpoint it mid-run, load it back, and training continues bit
   for bit (the random key, optimizer moments and algorithm states included);
3. nothing is hidden: forward and backpropagated samples are counted separately.

Run: ``python examples/jax_style.py`` (``--fast`` for a smoke run).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import sbfunc

BATCH, CLASSES = 64, 10


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(128, CLASSES),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="a tiny smoke run")
    args = parser.parse_args()
    torch.set_num_threads(2)
    epochs = 2 if args.fast else 10

    data = sbfunc.datasets.digits(key=sbfunc.random.key(0))
    torch.manual_seed(0)
    model = make_model()
    params, buffers = sbfunc.split_module(model, clone=True)
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")

    # The target transforms form one algorithm with `sequence` (one entry in the state, one
    # name); the engine flattens it, so it runs exactly like its parts listed in its place.
    # MixUp mixes inputs and targets before the forward, for the first half of training only;
    # label smoothing smooths the targets for the loss and restores them after it.
    targets = sbfunc.sequence(
        sbfunc.during(sbfunc.algorithms.MixUp(alpha=0.2, num_classes=CLASSES), 0.0, 0.5),
        sbfunc.algorithms.LabelSmoothing(0.05, num_classes=CLASSES),
        name="targets",
    )
    # Across the list, the ordering rule decides (once, when the step is built): CutOut is
    # listed before Selective Backprop, yet SB runs first on AFTER_DATALOADER, so it scores the
    # raw batch and CutOut only augments the kept rows (Composer's FILO pass would have run SB
    # last). The sequence's parts appear in the traces as targets/MixUp and targets/LabelSmoothing.
    algorithms = [
        sbfunc.algorithms.CutOut(length=0.25),
        sbfunc.SelectiveBackprop(start=0.3, end=1.0, keep=0.5, interrupt=2),
        targets,
    ]
    optimizer = sbfunc.optim.adamw(3e-3, weight_decay=1e-4)  # torch.optim.AdamW's update
    step = sbfunc.make_train_step(loss_fn, optimizer, algorithms)
    key = sbfunc.random.key(42)
    # The whole TrainState: params, buffers, AdamW's moments, one state per algorithm (a tuple
    # mirroring the list), the root key and the time. Every random draw of the run derives
    # from the root key, the step and the drawing algorithm's name. The run's length makes
    # time.elapsed advance with every step (MixUp's window and SB's start read it).
    steps_per_epoch = data.x_train.shape[0] // BATCH
    total = epochs * steps_per_epoch
    state = step.init(params, buffers, key=key, total_steps=total)

    run: dict[str, Any] = dict(epochs=epochs, steps_per_epoch=steps_per_epoch, history=False)

    def batches(epoch: int) -> Any:
        k = sbfunc.random.fold_in(key, epoch)
        return sbfunc.datasets.batches(data.x_train, data.y_train, BATCH, key=k)

    # 1. Train into SB's window (from 30% of the run) but not past MixUp's (to 50%), stopping
    #    (a preemption point) before a batch SB does not skip (interrupt=2 skips every second
    #    batch of an epoch); then look at the next step through its traces.
    stop = next(s for s in range(-(-3 * total // 10), total) if s % steps_per_epoch % 2 == 0)
    early = sbfunc.fit(step, state, batches, stop_after=stop, **run).state
    _, metrics = step(early, next(iter(batches(early.time.epoch))))
    print(f"\none step at {early.time.elapsed:.0%} of training:")
    for trace in metrics.traces:
        print(f"  {trace.event.name:<18} #{trace.order} {trace.name}")
    print(
        f"  rows in: {metrics.samples_in_batch}, backpropagated: "
        f"{metrics.samples_backpropagated}\n"
    )

    # 2. Checkpoint that state, load it into a template, train the rest.
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "early.pt"
        sbfunc.checkpoint.save(early, path)  # loads with torch.load(weights_only=True)
        resumed = sbfunc.checkpoint.load(path, like=state)
    final = sbfunc.fit(step, resumed, batches, **run).state
    straight = sbfunc.fit(step, state, batches, progress=False, **run).state
    same = all(torch.equal(final.params[k], straight.params[k]) for k in final.params)
    print(f"\nresumed run equals the uninterrupted one bit for bit: {same}")

    # 3. What it cost and what it learned.
    with torch.no_grad():
        logits = sbfunc.predict(model, final.params, final.buffers, data.x_test)  # eval mode
    acc = float((logits.argmax(1) == data.y_test).float().mean())
    t = final.time
    print(f"test accuracy: {acc:.3f}")
    print(
        f"steps: {t.step}, forward samples: {t.samples_forwarded:,}, "
        f"backpropagated samples: {t.samples_backpropagated:,} "
        f"({t.samples_backpropagated / (t.step * BATCH):.0%} of a plain run)"
    )


if __name__ == "__main__":
    main()
