import pytest
import torch
import torch.nn.functional as F
import torchopt
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


def _image_setup(algorithms):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    params, buffers = sbfunc.split_module(model, clone=True)
    opt = torchopt.sgd(0.1)
    state = sbfunc.init_state(
        params, buffers, key=sbrandom.key(1), opt_state=opt.init(params), algorithms=algorithms
    )
    x = torch.rand(N, 1, 4, 4) + 1.0  # never zero, so CutOut's zeros are visible
    y = torch.arange(N) % 3
    return model, opt, state, (x, y)


def _recording_loss(model, record):
    inner = sbfunc.per_sample_loss(model, F.cross_entropy)

    def loss_fn(params, buffers, batch):
        record.append(batch[0].clone())
        return inner(params, buffers, batch)

    return loss_fn


@pytest.mark.parametrize("order", ["cutout_first", "sb_first"])
def test_selective_backprop_scores_the_raw_batch_before_cutout(order):
    scored = []
    model, opt, state, batch = _image_setup(())
    sb = sbfunc.SelectiveBackprop(
        0.0, 1.0, 0.5, interrupt=0, loss_fn=_recording_loss(model, scored)
    )
    cutout = sbfunc.CutOut(length=0.5)
    after = Spy(sbfunc.Event.BEFORE_FORWARD, view=lambda b: b[0])
    algorithms = [cutout, sb, after] if order == "cutout_first" else [sb, cutout, after]
    train = sbfunc.make_train_step(sbfunc.per_sample_loss(model, F.cross_entropy), opt, algorithms)
    _, metrics = train(state, batch)
    assert torch.equal(scored[0], batch[0])  # SB saw every raw row, no holes
    ((_, x_seen),) = after.seen
    assert x_seen.shape[0] == N // 2 == metrics.samples_backpropagated  # CutOut saw kept rows
    assert bool((x_seen == 0).flatten(1).any(1).all())  # ... and cut every one of them


def test_selective_backprop_scores_before_mixup():
    scored = []
    model, opt, state, batch = _image_setup(())
    sb = sbfunc.SelectiveBackprop(
        0.0, 1.0, 0.5, interrupt=0, loss_fn=_recording_loss(model, scored)
    )
    mixup = sbfunc.MixUp(alpha=1.0, num_classes=3)
    spy = Spy(sbfunc.Event.AFTER_FORWARD)
    train = sbfunc.make_train_step(
        sbfunc.per_sample_loss(model, F.cross_entropy), opt, [mixup, sb, spy]
    )
    train(state, batch)
    assert torch.equal(scored[0], batch[0])
    ((_, (x, y)),) = spy.seen
    assert x.shape[0] == N // 2 and y.shape == (N // 2, 3)  # mixed soft targets on kept rows
    torch.testing.assert_close(y.sum(1), torch.ones(N // 2))
    assert not any(torch.equal(x[i], row) for i in range(len(x)) for row in batch[0])


def test_label_smoothing_smooths_for_the_loss_and_restores_after():
    model, opt, state, batch = _image_setup(())
    ls = sbfunc.LabelSmoothing(0.2, num_classes=3)
    spy = Spy(
        sbfunc.Event.BEFORE_LOSS,
        sbfunc.Event.AFTER_LOSS,
        sbfunc.Event.BEFORE_BACKWARD,
        view=lambda b: b[1],
    )
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    state = sbfunc.init_state(
        state.params, state.buffers, key=state.key, opt_state=state.opt_state, algorithms=[ls]
    )
    new_state, metrics = sbfunc.make_train_step(loss_fn, opt, [ls, spy])(state, batch)
    by_event = dict(spy.seen)
    # FILO: on BEFORE_LOSS the spy (listed later) runs after LabelSmoothing and sees soft
    # targets; on AFTER_LOSS it runs before the restore; on BEFORE_BACKWARD all is restored.
    assert by_event[sbfunc.Event.BEFORE_LOSS].shape == (N, 3)
    assert by_event[sbfunc.Event.AFTER_LOSS].shape == (N, 3)
    assert torch.equal(by_event[sbfunc.Event.BEFORE_BACKWARD], batch[1])
    smoothed = sbfunc.smooth_labels(batch[1], 0.2, 3)
    expected = loss_fn(state.params, state.buffers, (batch[0], smoothed)).mean()
    torch.testing.assert_close(metrics.loss, expected)
    assert "LabelSmoothing" not in new_state.algorithm_state  # nothing left stashed


def test_label_smoothing_refuses_unmatched_after_loss():
    ls = sbfunc.LabelSmoothing(0.1, num_classes=2)
    state = sbfunc.init_state({}, {}, key=sbrandom.key(0), algorithms=[ls])
    state = state.replace(batch=(torch.zeros(1, 2), torch.tensor([1])))
    with pytest.raises(RuntimeError, match="without the matching BEFORE_LOSS"):
        ls.apply(sbfunc.Event.AFTER_LOSS, state)


@pytest.mark.parametrize(
    ("factory", "exc", "msg"),
    [
        (lambda: sbfunc.CutOut(num_holes=0), ValueError, "num_holes"),
        (lambda: sbfunc.CutOut(length=0.0), ValueError, "length"),
        (lambda: sbfunc.CutOut(input=1.5), TypeError, "input"),
        (lambda: sbfunc.MixUp(alpha=0.0, num_classes=3), ValueError, "alpha"),
        (lambda: sbfunc.MixUp(num_classes=0), ValueError, "num_classes"),
        (lambda: sbfunc.MixUp(num_classes=3, target=None), TypeError, "target"),
        (lambda: sbfunc.LabelSmoothing(1.5, num_classes=3), ValueError, "smoothing"),
        (lambda: sbfunc.LabelSmoothing(0.1, num_classes=True), ValueError, "num_classes"),
    ],
)
def test_validation_at_construction(factory, exc, msg):
    with pytest.raises(exc, match=msg):
        factory()


def test_mixup_declares_loss_interpolation():
    assert sbfunc.MixUp(num_classes=3).interpolate_loss
    assert not sbfunc.CutOut().interpolate_loss
