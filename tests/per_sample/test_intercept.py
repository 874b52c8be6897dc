import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sbfunc
from sbfunc.per_sample import batch_grad
from sbfunc.per_sample._intercept import LayerRecorder
from tests.per_sample.helpers import loop_grads, setup


def record(loss_fn, params, buffers, batch, names=None):
    names = list(params) if names is None else names
    diff = {k: params[k].detach().requires_grad_() for k in names}
    n = sbfunc.batch.batch_size(batch)
    with LayerRecorder({id(v): k for k, v in diff.items()}, n) as rec:
        loss_fn({**params, **diff}, buffers, batch)
    return rec


def test_shared_and_non_layer_uses_fall_back():
    loss_fn, params, buffers, batch = setup("mixed")
    rec = record(loss_fn, params, buffers, batch)
    assert rec.covered() == {
        "conv.weight",
        "conv.bias",
        "conv2.weight",
        "seq.weight",
        "seq.bias",
        "head.bias",
    }
    assert rec.other == {"norm.weight", "norm.bias", "head.weight"}


def test_weight_used_twice_as_a_layer_weight_falls_back():
    torch.manual_seed(0)
    w = torch.randn(3, 3, dtype=torch.float64)
    params = {"w": w}

    def loss_fn(p, b, batch):
        x, y = batch
        return F.cross_entropy(
            F.linear(torch.tanh(F.linear(x, p["w"])), p["w"]), y, reduction="none"
        )

    batch = (torch.randn(4, 3, dtype=torch.float64), torch.tensor([0, 1, 2, 0]))
    assert record(loss_fn, params, {}, batch).covered() == set()
    torch.testing.assert_close(
        batch_grad(loss_fn)(params, {}, batch)["w"], loop_grads(loss_fn, params, {}, batch)["w"]
    )


def test_inplace_relu_after_a_layer_keeps_it_covered():
    loss_fn, params, buffers, batch = setup("cnn")  # Conv2d -> ReLU(inplace=True)
    assert record(loss_fn, params, buffers, batch).covered() == set(params)


def test_layer_input_modified_in_place_after_the_call_is_not_covered():
    w = torch.ones(2, 3, requires_grad=True)
    x = torch.ones(4, 3)
    with LayerRecorder({id(w): "w"}, 4) as rec:
        F.linear(x, w)
        x.mul_(2.0)
    assert len(rec.calls) == 1 and rec.covered() == set()


def test_frozen_weight_with_trainable_bias_and_unbatched_inputs():
    torch.manual_seed(0)
    model = nn.Linear(3, 2).double()
    params, buffers = sbfunc.split_module(model)
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    batch = (torch.randn(4, 3, dtype=torch.float64), torch.tensor([0, 1, 1, 0]))
    rec = record(loss_fn, params, buffers, batch, names=["bias"])
    assert rec.calls == [] and rec.other == {"bias"}
    ref = loop_grads(loss_fn, params, buffers, batch, names=["bias"])
    torch.testing.assert_close(batch_grad(loss_fn, wrt=["bias"])(params, buffers, batch), ref)
    # an input whose leading dimension is not the batch is not recorded
    w = torch.ones(2, 3, requires_grad=True)
    with LayerRecorder({id(w): "w"}, 4) as rec2:
        F.linear(torch.ones(3, 3), w)
    assert rec2.calls == [] and rec2.other == {"w"}


def test_batch_norm_in_eval_mode_passes_through():
    with LayerRecorder({}, 2):
        out = F.batch_norm(torch.randn(2, 3), torch.zeros(3), torch.ones(3), training=False)
    assert out.shape == (2, 3)
    with pytest.raises(ValueError, match="GroupNorm"), LayerRecorder({}, 2):
        F.batch_norm(torch.randn(2, 3), torch.zeros(3), torch.ones(3), training=True)
    with pytest.raises(ValueError, match="GroupNorm"), LayerRecorder({}, 2):
        torch.batch_norm(
            torch.randn(2, 3), None, None, torch.zeros(3), torch.ones(3), True, 0.1, 1e-5, False
        )
    with LayerRecorder({}, 2) as rec:  # no running statistics: per-sample normalization
        F.batch_norm(torch.randn(2, 3), None, None, training=True)
    assert rec.per_sample_norm and rec.covered() == set()
