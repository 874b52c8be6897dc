import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sbfunc
from sbfunc import random as sbrandom

N = 16


class Spy(sbfunc.Algorithm):
    """Records a view of the batch on the given events."""

    def __init__(self, *events, view=lambda batch: batch):
        self.events, self.view, self.seen = events, view, []

    def match(self, event, state):
        return event in self.events

    def apply(self, event, state):
        self.seen.append((event, self.view(state.batch)))
        return state


def _image_setup():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    params, buffers = sbfunc.split_module(model, clone=True)
    x = torch.rand(N, 1, 4, 4) + 1.0  # never zero, so CutOut's zeros are visible
    y = torch.arange(N) % 3
    return model, params, buffers, (x, y)


def _step(model, params, buffers, algorithms, loss_fn=None):
    """A train step of ``algorithms`` and its initial state."""
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy) if loss_fn is None else loss_fn
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1), algorithms)
    return step, step.init(params, buffers, key=sbrandom.key(1))


def _recording_loss(model, record):
    inner = sbfunc.per_sample_loss(model, F.cross_entropy)

    def loss_fn(params, buffers, batch):
        record.append(batch[0].clone())
        return inner(params, buffers, batch)

    return loss_fn


@pytest.mark.parametrize("order", ["cutout_first", "sb_first"])
def test_selective_backprop_scores_the_raw_batch_before_cutout(order):
    scored = []
    model, params, buffers, batch = _image_setup()
    sb = sbfunc.SelectiveBackprop(
        0.0,
        1.0,
        0.5,
        interrupt=0,
        scoring=sbfunc.score.Scoring(loss_fn=_recording_loss(model, scored)),
    )
    cutout = sbfunc.algorithms.CutOut(length=0.5)
    after = Spy(sbfunc.Event.BEFORE_FORWARD, view=lambda b: b[0])
    algorithms = [cutout, sb, after] if order == "cutout_first" else [sb, cutout, after]
    train, state = _step(model, params, buffers, algorithms)
    _, metrics = train(state, batch)
    assert torch.equal(scored[0], batch[0])  # SB saw every raw row, no holes
    ((_, x_seen),) = after.seen
    assert x_seen.shape[0] == N // 2 == metrics.samples_backpropagated  # CutOut saw kept rows
    assert bool((x_seen == 0).flatten(1).any(1).all())  # ... and cut every one of them


def test_selective_backprop_scores_before_mixup():
    scored = []
    model, params, buffers, batch = _image_setup()
    sb = sbfunc.SelectiveBackprop(
        0.0,
        1.0,
        0.5,
        interrupt=0,
        scoring=sbfunc.score.Scoring(loss_fn=_recording_loss(model, scored)),
    )
    mixup = sbfunc.algorithms.MixUp(alpha=1.0, num_classes=3)
    spy = Spy(sbfunc.Event.AFTER_FORWARD)
    train, state = _step(model, params, buffers, [mixup, sb, spy])
    train(state, batch)
    assert torch.equal(scored[0], batch[0])
    ((_, (x, y)),) = spy.seen
    assert x.shape[0] == N // 2 and y.shape == (N // 2, 3)  # mixed soft targets on kept rows
    torch.testing.assert_close(y.sum(1), torch.ones(N // 2))
    # mixed (a row the permutation maps to itself stays raw, so not every row need change)
    assert not all(any(torch.equal(x[i], row) for row in batch[0]) for i in range(len(x)))


def test_label_smoothing_smooths_for_the_loss_and_restores_after():
    model, params, buffers, batch = _image_setup()
    ls = sbfunc.algorithms.LabelSmoothing(0.2, num_classes=3)
    spy = Spy(
        sbfunc.Event.BEFORE_LOSS,
        sbfunc.Event.AFTER_LOSS,
        sbfunc.Event.BEFORE_BACKWARD,
        view=lambda b: b[1],
    )
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    step, state = _step(model, params, buffers, [ls, spy], loss_fn)
    new_state, metrics = step(state, batch)
    by_event = dict(spy.seen)
    # FILO: on BEFORE_LOSS the spy (listed later) runs after LabelSmoothing and sees soft
    # targets; on AFTER_LOSS it runs before the restore; on BEFORE_BACKWARD all is restored.
    assert by_event[sbfunc.Event.BEFORE_LOSS].shape == (N, 3)
    assert by_event[sbfunc.Event.AFTER_LOSS].shape == (N, 3)
    assert torch.equal(by_event[sbfunc.Event.BEFORE_BACKWARD], batch[1])
    smoothed = sbfunc.algorithms.smooth_labels(batch[1], 0.2, 3)
    expected = loss_fn(state.params, state.buffers, (batch[0], smoothed)).mean()
    torch.testing.assert_close(metrics.loss, expected)
    assert new_state.algorithm_state == (None, None)  # the targets waited in scratch only


def test_label_smoothing_keeps_the_targets_in_scratch_and_refuses_unmatched_after_loss():
    ls = sbfunc.algorithms.LabelSmoothing(0.1, num_classes=2)
    y = torch.tensor([1])
    state = sbfunc.Context(sbrandom.key(0), batch=(torch.zeros(1, 2), y), own=ls.init(None))
    smoothed = ls.apply(sbfunc.Event.BEFORE_LOSS, state)
    assert smoothed.scratch is y and smoothed.own is None and state.scratch is None
    restored = ls.apply(sbfunc.Event.AFTER_LOSS, smoothed)
    assert restored.batch[1] is y and restored.scratch is None
    with pytest.raises(RuntimeError, match="without the matching BEFORE_LOSS"):
        ls.apply(sbfunc.Event.AFTER_LOSS, state)


@pytest.mark.parametrize(
    ("alg", "event"),
    [
        (sbfunc.algorithms.CutOut(length=0.5), sbfunc.Event.AFTER_DATALOADER),
        (sbfunc.algorithms.MixUp(alpha=1.0, num_classes=3), sbfunc.Event.BEFORE_FORWARD),
    ],
)
def test_augmentations_draw_from_the_state_key_only(alg, event):
    _, _, _, batch = _image_setup()
    state = sbfunc.Context(sbrandom.key(5), batch=batch)
    first, again = alg.apply(event, state), alg.apply(event, state)
    other = alg.apply(event, state.replace(key=sbrandom.key(6)))
    assert torch.equal(first.batch[0], again.batch[0])  # deterministic per key
    assert not torch.equal(first.batch[0], other.batch[0])  # the key is what varies it
    assert first.own == state.own and state.batch is batch and first.key is state.key
    assert alg.match(event, state) and not alg.match(sbfunc.Event.BATCH_END, state)


@pytest.mark.parametrize(
    ("factory", "exc", "msg"),
    [
        (lambda: sbfunc.algorithms.CutOut(num_holes=0), ValueError, "num_holes"),
        (lambda: sbfunc.algorithms.CutOut(length=0.0), ValueError, "length"),
        (lambda: sbfunc.algorithms.CutOut(input=1.5), TypeError, "input"),
        (lambda: sbfunc.algorithms.MixUp(alpha=-1.0, num_classes=3), ValueError, "alpha"),
        (lambda: sbfunc.algorithms.CutOut(uniform_sampling="yes"), TypeError, "uniform_sampling"),
        (lambda: sbfunc.algorithms.MixUp(num_classes=0), ValueError, "num_classes"),
        (lambda: sbfunc.algorithms.MixUp(num_classes=3, target=None), TypeError, "target"),
        (lambda: sbfunc.algorithms.LabelSmoothing(1.5, num_classes=3), ValueError, "smoothing"),
        (
            lambda: sbfunc.algorithms.LabelSmoothing(0.1, num_classes=True),
            TypeError,
            "num_classes",
        ),
    ],
)
def test_validation_at_construction(factory, exc, msg):
    with pytest.raises(exc, match=msg):
        factory()


def test_mixup_declares_loss_interpolation():
    assert sbfunc.algorithms.MixUp(num_classes=3).interpolate_loss
    assert not sbfunc.algorithms.CutOut().interpolate_loss


def test_label_smoothing_per_pixel_targets_class_axis_second_in_a_step():
    torch.manual_seed(0)
    model = nn.Conv2d(2, 3, 1)  # per-pixel logits [N, 3, H, W]
    params, buffers = sbfunc.split_module(model, clone=True)
    x, y = torch.rand(4, 2, 5, 5), torch.randint(0, 3, (4, 5, 5))
    ls = sbfunc.algorithms.LabelSmoothing(0.2, num_classes=3)
    spy = Spy(sbfunc.Event.BEFORE_LOSS, view=lambda b: b[1])
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    step, state = _step(model, params, buffers, [ls, spy], loss_fn)
    _, metrics = step(state, (x, y))
    ((_, seen),) = spy.seen
    assert seen.shape == (4, 3, 5, 5)  # not (4, 5, 5, 3)
    torch.testing.assert_close(seen.sum(1), torch.ones(4, 5, 5))
    expected = loss_fn(
        state.params, state.buffers, (x, sbfunc.algorithms.smooth_labels(y, 0.2, 3))
    ).mean()
    torch.testing.assert_close(metrics.loss, expected)


def test_mixup_alpha_zero_leaves_the_inputs():
    _, _, _, batch = _image_setup()
    state = sbfunc.Context(sbrandom.key(0), batch=batch)
    out = sbfunc.algorithms.MixUp(alpha=0.0, num_classes=3).apply(
        sbfunc.Event.BEFORE_FORWARD, state
    )
    assert torch.equal(out.batch[0], batch[0])
    assert torch.equal(out.batch[1], sbfunc.algorithms.soft_targets(batch[1], 3))


def test_cutout_uniform_sampling_reaches_cutout_batch():
    _, _, _, batch = _image_setup()
    state = sbfunc.Context(sbrandom.key(4), batch=batch)
    out = sbfunc.algorithms.CutOut(length=0.5, uniform_sampling=True).apply(
        sbfunc.Event.AFTER_DATALOADER, state
    )
    expected = sbfunc.algorithms.cutout_batch(
        batch[0], key=state.key, length=0.5, uniform_sampling=True
    )
    assert torch.equal(out.batch[0], expected)
