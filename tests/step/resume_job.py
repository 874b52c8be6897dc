"""A small deterministic training job for the resume test, runnable in a fresh process:

    python -m tests.step.resume_job CHECKPOINT_IN CHECKPOINT_OUT NUM_THREADS

loads a state saved mid-training, finishes the run and saves the final state.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import sbfunc
from sbfunc import random as sbrandom

EPOCHS, BATCH, N = 3, 16, 96


def build() -> tuple[sbfunc.step.TrainStep, sbfunc.TrainState, Any]:
    """The step (SB with a stateful policy, CutOut, LabelSmoothing, BatchNorm, Adam), a fresh
    state and the per-epoch data."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv1d(1, 4, 3, padding=1),
        nn.BatchNorm1d(4),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(32, 3),
    )
    params, buffers = sbfunc.split_module(model, clone=True)
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    algorithms = [
        sbfunc.SelectiveBackprop(0.2, 0.9, interrupt=3, policy=sbfunc.policies.jiang_cdf(2.0)),
        sbfunc.algorithms.CutOut(length=0.25),
        sbfunc.algorithms.LabelSmoothing(0.1, num_classes=3),
    ]
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.adam(1e-2), algorithms)
    key = sbrandom.key(7)
    state = step.init(params, buffers, key=key)
    x = sbrandom.uniform(sbrandom.fold_in(key, 1), (N, 1, 8))
    y = (x[:, 0, :4].sum(1) > x[:, 0, 4:].sum(1)).long() + (x[:, 0, 0] > 0.5).long()

    def data(epoch: int) -> Any:
        return sbfunc.datasets.batches(x, y, BATCH, key=sbrandom.fold_in(key, 100 + epoch))

    return step, state, data


def run(
    state: sbfunc.TrainState | None = None, stop_after: int | None = None
) -> sbfunc.TrainState:
    step, fresh, data = build()
    result = sbfunc.fit(
        step,
        fresh if state is None else state,
        data,
        epochs=EPOCHS,
        steps_per_epoch=N // BATCH,
        progress=False,
        stop_after=stop_after,
    )
    return result.state


def template() -> sbfunc.TrainState:
    return build()[1]


if __name__ == "__main__":
    path_in, path_out, threads = sys.argv[1:4]
    torch.set_num_threads(int(threads))
    resumed = sbfunc.checkpoint.load(path_in, like=template())
    sbfunc.checkpoint.save(run(resumed), path_out)
