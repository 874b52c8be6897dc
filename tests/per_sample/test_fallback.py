import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sbfunc
from sbfunc.per_sample import VmapFallbackWarning, batch_grad, batch_l2_grad, variance
from sbfunc.per_sample._fallback import loop_grads, vmap_grads
from tests.per_sample import helpers
from tests.per_sample.helpers import recurrent, setup


def test_vmap_grads_match_the_loop_for_any_parameter():
    loss_fn, params, buffers, batch = setup("mixed")
    names = ["norm.weight", "head.weight", "conv.bias"]
    got = vmap_grads(loss_fn, params, buffers, batch, names)
    ref = helpers.loop_grads(loss_fn, params, buffers, batch, names=names)
    for k in names:
        torch.testing.assert_close(got[k], ref[k])


def test_torch_vmap_batch_norm_error_is_explained():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    params, buffers = sbfunc.split_module(model, clone=True)
    loss_fn = sbfunc.per_sample_loss(model, F.mse_loss, mode="train")
    batch = (torch.randn(5, 3), torch.randn(5, 4))
    with pytest.raises(ValueError, match="replace_all_batch_norm_modules_") as info:
        vmap_grads(loss_fn, params, buffers, batch, ["0.weight"])
    assert isinstance(info.value.__cause__, RuntimeError)


def test_other_errors_propagate_from_the_loop():
    def loss_fn(p, b, batch):
        raise RuntimeError("boom")

    with (
        pytest.warns(VmapFallbackWarning, match="in the loss function .*loss_fn with: boom"),
        pytest.raises(RuntimeError, match="boom"),
    ):
        vmap_grads(loss_fn, {"w": torch.ones(1)}, {}, (torch.ones(2, 1),), ["w"])


@pytest.mark.filterwarnings("ignore:There is a performance drop")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("cell", [nn.RNN, nn.GRU, nn.LSTM])
def test_recurrent_nets_match_the_autograd_loop(cell, batch_first, dtype):
    loss_fn, params, buffers, batch = recurrent(cell, batch_first, dtype)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        grads = batch_grad(loss_fn)(params, buffers, batch, subsampling=[4, 0, 2], chunk_size=2)
    ref = helpers.loop_grads(loss_fn, params, buffers, batch, indices=[4, 0, 2])
    assert set(grads) == set(params)
    for k in params:
        torch.testing.assert_close(grads[k], ref[k], msg=k)
    fallback = [str(w.message) for w in caught if w.category is VmapFallbackWarning]
    vmap_fails = cell is not nn.LSTM or dtype is torch.float64
    assert bool(fallback) == vmap_fails
    if vmap_fails:
        assert f"vmap failed in 'rnn' ({cell.__name__}) with: output with shape" in fallback[0]


@pytest.mark.filterwarnings("ignore::sbfunc.per_sample.VmapFallbackWarning")
def test_norms_and_moments_of_recurrent_nets():
    loss_fn, params, buffers, batch = recurrent(nn.GRU, True, torch.float64)
    ref = helpers.loop_grads(loss_fn, params, buffers, batch)
    norms = batch_l2_grad(loss_fn)(params, buffers, batch)
    torch.testing.assert_close(
        norms.total, sum(g.flatten(1).square().sum(1) for g in ref.values())
    )
    var = variance(loss_fn, wrt=["rnn"])(params, buffers, batch)
    for k, v in var.items():
        torch.testing.assert_close(v, ref[k].var(0, unbiased=False))


def test_the_fallback_warns_once_per_cause():
    loss_fn, params, buffers, batch = recurrent(nn.RNN, True, torch.float32)
    names = ["rnn.weight_ih_l0"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(3):
            vmap_grads(loss_fn, params, buffers, batch, names)
    assert [w.category for w in caught] == [VmapFallbackWarning]
    assert "per-sample gradients of rnn.weight_ih_l0 fall back to a loop" in str(caught[0].message)


def test_loop_grads_follow_the_per_sample_spec():
    # a class-weight tensor with C == N only looks per-sample: the spec keeps it whole
    def loss_fn(params, buffers, batch):
        w = batch["class_weight"][batch["y"]]
        return w * (batch["x"] @ params["w"]).square()

    n = 3
    batch = {"x": torch.randn(n, 2), "y": torch.tensor([0, 2, 1]), "class_weight": torch.ones(n)}
    batch["class_weight"] = torch.tensor([1.0, 2.0, 3.0])
    spec = {"class_weight": False}
    params = {"w": torch.ones(2)}
    got = loop_grads(loss_fn, params, {}, batch, ["w"], per_sample=spec)
    via_vmap = vmap_grads(loss_fn, params, {}, batch, ["w"], per_sample=spec)
    ref = torch.stack(
        [torch.func.grad(lambda p, i=i: loss_fn(p, {}, batch)[i])(params)["w"] for i in range(n)]
    )
    torch.testing.assert_close(got["w"], ref)
    torch.testing.assert_close(via_vmap["w"], ref)
    grads = batch_grad(lambda p, b, x: loss_fn(p, b, x), per_sample=spec)(
        params, {}, batch, subsampling=[2, 0]
    )
    torch.testing.assert_close(grads["w"], ref[[2, 0]])


def test_strings_in_the_batch_stay_whole_under_vmap():
    model = nn.Linear(2, 2)
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, input="x", target="y")
    params, buffers = sbfunc.split_module(model)
    batch = {"x": torch.randn(4, 2), "y": torch.tensor([0, 1, 1, 0]), "text": list("abcd")}
    got = vmap_grads(loss_fn, params, buffers, batch, ["weight"])
    ref = helpers.loop_grads(loss_fn, params, buffers, batch, ["weight"])
    torch.testing.assert_close(got["weight"], ref["weight"])
