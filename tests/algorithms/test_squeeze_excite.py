import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import sbfunc
from sbfunc.algorithms import SqueezeExcite, SqueezeExciteConv2d

common = settings(max_examples=20, deadline=None, derandomize=True, database=None)


def _net(channels=(3, 8, 16)):
    torch.manual_seed(0)
    layers = [nn.Conv2d(a, b, 3, padding=1) for a, b in itertools.pairwise(channels)]
    return nn.Sequential(
        *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels[-1], 2)
    )


@common
@given(st.integers(0, 20), st.sampled_from([0.25, 0.5, 2, 5]), st.integers(0, 2**31 - 1))
def test_blocks_follow_wide_convolutions_and_gate_channels(min_channels, latent, seed):
    net = _net()
    wide = [min(m.in_channels, m.out_channels) >= min_channels for m in net[:2]]
    if not any(wide):
        with pytest.raises(ValueError, match="would change nothing"):
            SqueezeExcite(latent, min_channels)(net)
        return
    new = SqueezeExcite(latent, min_channels)(net)
    x = torch.randn(2, 3, 5, 5, generator=torch.Generator().manual_seed(seed))
    h = x
    for old, m, is_wide in zip(net[:2], new[:2], wide, strict=True):
        assert isinstance(m, SqueezeExciteConv2d) == is_wide
        conv_out = old(h)
        out = m(h)
        if is_wide:
            assert torch.equal(m.conv.weight, old.weight)  # the convolution is kept
            gate = out / conv_out  # one gate per (row, channel), in (0, 1)
            assert bool(((gate > 0) & (gate < 1)).all())
            torch.testing.assert_close(gate, gate[:, :, :1, :1].expand_as(gate))
            c = old.out_channels
            hidden = int(latent) if latent >= 1 else int(latent * c)
            assert m.se.pool_and_mlp[2].out_features == max(1, hidden)
        else:
            assert torch.equal(out, conv_out)
        h = out
    assert new(x).shape == (2, 2)


def test_surgery_is_pure_and_applying_it_twice_adds_nothing():
    net = _net()
    names = [n for n, _ in net.named_parameters()]
    once = SqueezeExcite(latent_channels=4, min_channels=8)(net)
    twice = SqueezeExcite(latent_channels=4, min_channels=8)(once)
    assert [n for n, _ in net.named_parameters()] == names
    assert [n for n, _ in once.named_parameters()] == [n for n, _ in twice.named_parameters()]
    assert "1.se.pool_and_mlp.2.weight" in dict(once.named_parameters())
    x = torch.randn(1, 3, 4, 4)
    assert torch.equal(once(x), twice(x))


def test_trains_in_a_step():
    model = SqueezeExcite(latent_channels=0.5, min_channels=8)(_net())
    loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy, mode="train")
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1))
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))
    new, metrics = step(state, (torch.randn(4, 3, 5, 5), torch.tensor([0, 1, 0, 1])))
    key = "1.se.pool_and_mlp.4.weight"
    assert not torch.equal(new.params[key], state.params[key])
    assert bool(torch.isfinite(metrics.loss))


@pytest.mark.parametrize(
    ("kwargs", "exc", "msg"),
    [
        ({"latent_channels": 0}, ValueError, "latent_channels"),
        ({"latent_channels": "a"}, TypeError, "latent_channels"),
        ({"min_channels": -1}, ValueError, "min_channels must be an int >= 0"),
        ({"min_channels": 1.5}, TypeError, "min_channels"),
    ],
)
def test_errors(kwargs, exc, msg):
    with pytest.raises(exc, match=msg):
        SqueezeExcite(**kwargs)
