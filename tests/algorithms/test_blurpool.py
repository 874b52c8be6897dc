import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import sbfunc
from sbfunc import random as sbrandom
from sbfunc.algorithms import BlurConv2d, BlurMaxPool2d, BlurPool
from sbfunc.testing import events

common = settings(max_examples=25, deadline=None, derandomize=True, database=None)
FILTER = torch.tensor([1.0, 2.0, 1.0])
FILTER = (FILTER[:, None] * FILTER[None, :]) / 16  # the paper's [1 2 1] x [1 2 1] / 16


def _blur(x, stride):
    """Reference anti-aliasing filter: depthwise binomial blur, zero padding 1, then stride."""
    weight = FILTER.expand(x.shape[1], 1, 3, 3)
    return F.conv2d(x, weight, stride=stride, padding=1, groups=x.shape[1])


@common
@given(
    st.integers(0, 2**32),
    st.sampled_from([1, 3, 5]),
    st.sampled_from([2, 3]),
    st.integers(0, 2),
    st.sampled_from([1, 2]),
    st.sampled_from([9, 12]),
    st.booleans(),
)
def test_blur_conv_keeps_shape_and_params_and_blurs(seed, k, stride, pad, dil, size, first):
    torch.manual_seed(seed % 1000)
    conv = nn.Conv2d(4, 5, k, stride=stride, padding=pad, dilation=dil)
    x = sbrandom.uniform(sbrandom.key(seed), (2, 4, size, size))
    blurred = BlurConv2d(conv, blur_first=first)
    out = blurred(x)
    assert out.shape == conv(x).shape
    assert conv.stride == (stride, stride)  # the original is not modified
    assert torch.equal(blurred.conv.weight, conv.weight) and torch.equal(
        blurred.conv.bias, conv.bias
    )
    if first:
        expected = conv(_blur(x, 1))
    else:
        expected = _blur(F.conv2d(x, conv.weight, conv.bias, 1, pad, dil), stride)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@common
@given(
    st.integers(0, 2**32),
    st.sampled_from([2, 3]),
    st.sampled_from([1, 2, 3]),
    st.integers(0, 1),
    st.sampled_from([7, 8, 11]),
)
def test_blur_max_pool_keeps_shape_and_blurs_the_maxes(seed, k, stride, pad, size):
    pool = nn.MaxPool2d(k, stride=stride, padding=pad)
    x = sbrandom.uniform(sbrandom.key(seed), (2, 3, size, size))
    out = BlurMaxPool2d(pool)(x)
    assert out.shape == pool(x).shape
    expected = _blur(F.max_pool2d(x, k, 1, pad), stride)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)


def _net():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),  # the RGB stem: fewer than min_channels
        nn.ReLU(),
        nn.MaxPool2d(3, stride=2, padding=1),
        nn.Sequential(nn.Conv2d(16, 16, 3, stride=2, padding=1), nn.Conv2d(16, 8, 3, padding=1)),
        nn.MaxPool2d(2, ceil_mode=True),  # ceil_mode: sizes a strided blur cannot give
        nn.Flatten(),
    )


def test_the_surgery_replaces_strided_layers_and_keeps_everything_else():
    net = _net()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    out = BlurPool(min_channels=16)(net)
    kinds = [type(m).__name__ for m in out]
    assert kinds == ["Conv2d", "ReLU", "BlurMaxPool2d", "Sequential", "MaxPool2d", "Flatten"]
    assert [type(m).__name__ for m in out[3]] == ["BlurConv2d", "Conv2d"]
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())  # input intact
    assert type(net[2]) is nn.MaxPool2d
    params, _ = sbfunc.split_module(out)
    renamed = {k.replace("3.0.conv.", "3.0."): v for k, v in params.items()}
    assert renamed.keys() == dict(net.named_parameters()).keys()
    assert all(torch.equal(renamed[k], v) for k, v in net.named_parameters())
    x = torch.rand(2, 3, 32, 32)
    assert out(x).shape == net(x).shape
    twice = BlurPool(min_channels=16)(out)  # idempotent
    assert [type(m).__name__ for m in twice[3]] == ["BlurConv2d", "Conv2d"]
    assert isinstance(twice[3][0].conv, nn.Conv2d)


def test_blurpool_preserves_the_function_where_it_replaces_nothing():
    net = _net()
    x = torch.rand(2, 3, 32, 32)
    same = BlurPool(replace_maxpools=False, min_channels=17)(net)
    torch.testing.assert_close(same(x), net(x), atol=0, rtol=0)
    stem_only = BlurPool(min_channels=3)(net[0])  # the module itself is replaced
    assert isinstance(stem_only, BlurConv2d)


def test_blurpooled_model_trains_in_a_step():
    model = nn.Sequential(BlurPool(min_channels=3)(_net()), nn.LazyLinear(3))
    model(torch.rand(1, 3, 32, 32))  # materialise the lazy layer
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1), [BlurPool()])
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbrandom.key(0))
    new, metrics = step(state, (torch.rand(4, 3, 32, 32), torch.tensor([0, 1, 2, 0])))
    assert metrics.samples_backpropagated == 4 and bool(torch.isfinite(metrics.loss))
    name = "0.0.conv.weight"
    assert not torch.equal(new.params[name], state.params[name])  # gradients reach it


@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(events())
def test_blurpool_algorithm_matches_no_event(event):
    assert BlurPool().match(event, sbfunc.Context(sbrandom.key(0))) is False


def test_blurpool_surgery_uses_its_settings():
    bp = BlurPool(replace_convs=False, blur_first=False, min_channels=0)
    out = bp(_net())
    assert type(out[3][0]) is nn.Conv2d and type(out[2]) is BlurMaxPool2d
    state = sbfunc.Context(sbrandom.key(0))
    assert bp.apply(sbfunc.Event.INIT, state) is state


@pytest.mark.parametrize(
    ("call", "exc", "msg"),
    [
        (lambda: BlurPool()("net"), TypeError, "torch.nn.Module"),
        (lambda: BlurPool(blur_first=1), TypeError, "blur_first"),
        (lambda: BlurPool(min_channels=-1), ValueError, "min_channels"),
        (lambda: BlurPool(replace_convs="yes"), TypeError, "replace_convs"),
        (lambda: BlurConv2d(nn.Conv2d(2, 2, 3, stride=(2, 1))), ValueError, "square stride"),
        (
            lambda: BlurMaxPool2d(nn.MaxPool2d(2, return_indices=True)),
            ValueError,
            "return_indices",
        ),
    ],
)
def test_blurpool_errors(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()
