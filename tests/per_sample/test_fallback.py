import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sbfunc
from sbfunc.per_sample.fallback import vmap_grads
from tests.per_sample.helpers import loop_grads, setup


def test_vmap_grads_match_the_loop_for_any_parameter():
    loss_fn, params, buffers, batch = setup("mixed")
    names = ["norm.weight", "head.weight", "conv.bias"]
    got = vmap_grads(loss_fn, params, buffers, batch, names)
    ref = loop_grads(loss_fn, params, buffers, batch, names=names)
    for k in names:
        torch.testing.assert_close(got[k], ref[k])


def test_torch_vmap_batch_norm_error_is_explained():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    params, buffers = sbfunc.split_module(model, clone=True)
    loss_fn = sbfunc.per_sample_loss(model, F.mse_loss, train=True)
    batch = (torch.randn(5, 3), torch.randn(5, 4))
    with pytest.raises(ValueError, match="replace_all_batch_norm_modules_") as info:
        vmap_grads(loss_fn, params, buffers, batch, ["0.weight"])
    assert isinstance(info.value.__cause__, RuntimeError)


def test_other_errors_propagate():
    def loss_fn(p, b, batch):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        vmap_grads(loss_fn, {"w": torch.ones(1)}, {}, (torch.ones(2, 1),), ["w"])
