import torch
import torch.nn.functional as F
from hypothesis import given, settings
from torch import nn

import sbfunc
from sbfunc import random as sbrandom
from sbfunc.algorithms._channels_last import (
    ChannelsLast,
    channels_last_tensors,
)
from sbfunc.testing import events

CL = torch.channels_last


def _net():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(128, 3),
    )


def test_the_surgery_changes_the_layout_not_the_function():
    net = _net().eval()
    x = torch.rand(2, 3, 4, 4)
    out = ChannelsLast()(net)
    assert out[0].weight.is_contiguous(memory_format=CL)
    assert net[0].weight.is_contiguous() and not net[0].weight.is_contiguous(memory_format=CL)
    torch.testing.assert_close(out(x), net(x))


def test_channels_last_tensors_keeps_values():
    tensors = {"w": torch.rand(4, 3, 2, 2), "b": torch.rand(4), "m": torch.rand(3, 3)}
    out = channels_last_tensors(tensors)
    assert out["w"].is_contiguous(memory_format=CL) and torch.equal(out["w"], tensors["w"])
    assert out["b"] is tensors["b"] and out["m"] is tensors["m"] and out is not tensors


def _train(algorithms):
    model = _net()
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1, momentum=0.9), algorithms)
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbrandom.key(0))
    batch = (torch.rand(4, 3, 4, 4), torch.tensor([0, 1, 2, 0]))
    init = state
    for _ in range(2):
        state, metrics = step(state, batch)
    return init, state, metrics


def test_channels_last_on_init_keeps_the_training_the_same():
    init, state, metrics = _train([ChannelsLast()])
    assert init.params["0.weight"].is_contiguous(memory_format=CL)
    assert state.params["0.weight"].is_contiguous(memory_format=CL)  # the update keeps it
    _, plain, plain_metrics = _train([])
    torch.testing.assert_close(metrics.loss, plain_metrics.loss)
    for name, value in plain.params.items():
        torch.testing.assert_close(state.params[name], value)


@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(events())
def test_channels_last_matches_init_only(event):
    assert ChannelsLast().match(event, sbfunc.Context(sbrandom.key(0))) == (
        event == sbfunc.Event.INIT
    )
