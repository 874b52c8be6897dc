"""The step and :func:`sbfunc.fit` on the ``meta`` device (tensors without data: a host read
or a device mix raises there, where an accelerator would sync). The step reads nothing unless
``nonfinite="raise"`` (the guard's check in ``TrainStep.finish``); ``fit`` reads nothing
between steps except the loss every ``log_every`` steps, each evaluation's metrics, and the
count of left-out rows once at the end of the call (docs/how-to/compile.md)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sbfunc
from sbfunc import random as sbrandom
from tests.helpers import split
from tests.meta import META, all_meta, empty, host_read, sbfunc_frames, sync_site, to_meta

N, EPOCHS, STEPS_PER_EPOCH = 8, 2, 3
GUARD_AT = ("step/_train_step.py", "_raise_if_nonfinite")


def _build(nonfinite="skip", sb=True, microbatch_size=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    algorithms = [sbfunc.SelectiveBackprop(0.0, 1.0, interrupt=0)] if sb else []
    step = sbfunc.make_train_step(
        loss_fn,
        sbfunc.optim.adam(1e-3),
        algorithms,
        nonfinite=nonfinite,
        microbatching=split(size=microbatch_size),
    )
    params, buffers = to_meta(sbfunc.split_module(model, clone=True))
    return loss_fn, step, step.init(params, buffers, key=sbrandom.key(0).to(META))


def _batch():
    return empty(N, 4), empty(N, dtype=torch.int64)


@pytest.mark.parametrize("microbatch_size", [None, 3])
@pytest.mark.parametrize("sb", [False, True])
@pytest.mark.parametrize("nonfinite", ["skip", "allow"])
def test_the_step_reads_nothing(nonfinite, sb, microbatch_size):
    _, step, state = _build(nonfinite, sb, microbatch_size)
    for _ in range(2):
        state, metrics = step(state, _batch())
    assert metrics.samples_backpropagated == (N // 2 if sb else N)
    assert all_meta(state) and all_meta(metrics.loss)


@pytest.mark.parametrize("microbatch_size", [None, 3])
@pytest.mark.parametrize("sb", [False, True])
def test_nonfinite_raise_reads_only_in_the_guard_of_finish(sb, microbatch_size):
    _, step, state = _build("raise", sb, microbatch_size)
    with host_read() as error:
        step(state, _batch())
    assert sync_site(error.value) == GUARD_AT
    assert ("step/_train_step.py", "finish") in sbfunc_frames(error.value)


class _Counted:
    """The training data of ``fit``, counting the batches fetched."""

    def __init__(self) -> None:
        self.fetched = 0

    def __call__(self, epoch: int):
        for _ in range(STEPS_PER_EPOCH):
            self.fetched += 1
            yield _batch()


def _fit_until_read(nonfinite="skip", **kwargs):
    """Run ``fit`` on meta to its first host read; returns (error, batches fetched by then)."""
    _, step, state = _build(nonfinite)
    data = _Counted()
    with host_read() as error:
        sbfunc.fit(step, state, data, epochs=EPOCHS, steps_per_epoch=STEPS_PER_EPOCH, **kwargs)
    return error.value, data.fetched


@pytest.mark.parametrize("progress", [False, True])
@pytest.mark.parametrize("nonfinite", ["skip", "allow"])
def test_fit_reads_nothing_until_the_end_of_the_call(nonfinite, progress):
    error, fetched = _fit_until_read(nonfinite, progress=progress, log_every=1000)
    assert fetched == EPOCHS * STEPS_PER_EPOCH  # every step ran
    assert sync_site(error) == ("step/_sequence.py", "_grew")  # the run's counts, read once
    assert ("step/_sequence.py", "check_rows") in sbfunc_frames(error)
    assert ("step/_loop.py", "_run") in sbfunc_frames(error)  # after the loop


def test_fit_reads_the_loss_every_log_every_steps_only():
    error, fetched = _fit_until_read(progress=True, log_every=4)
    assert fetched == 4
    assert sync_site(error) == ("step/_sequence.py", "step_fields")


def test_fit_reads_each_evaluation_s_metrics_only():
    loss_fn = _build()[0]

    def metrics(params, buffers, batch):
        return {"loss": sbfunc.module.eval_outputs(loss_fn, params, buffers, batch).losses}

    every = sbfunc.engine.Duration(steps=2)
    error, fetched = _fit_until_read(
        progress=False, evaluator=sbfunc.step.Evaluator([_batch()], metrics, every)
    )
    assert fetched == 2
    assert sync_site(error) == ("step/_sequence.py", "read")  # host_metrics
    assert ("step/_sequence.py", "host_metrics") in sbfunc_frames(error)


def test_fit_with_nonfinite_raise_reads_in_the_first_step_s_guard():
    error, fetched = _fit_until_read("raise", progress=False)
    assert fetched == 1
    assert sync_site(error) == GUARD_AT
