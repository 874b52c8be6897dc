"""Parity with BackPACK 1.7.1 (optional: ``pip install --no-deps backpack-for-pytorch==1.7.1
unfoldNd einops``); skipped cleanly when it is not installed."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sbfunc
from sbfunc.per_sample import batch_grad, batch_l2_grad, sum_grad_squared, variance

backpack = pytest.importorskip("backpack")
extensions = pytest.importorskip("backpack.extensions")


def _models(groups=1):
    torch.manual_seed(0)
    seed = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    cnn = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(4, 4, 3, stride=2, groups=groups),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(36, 10),
    )
    return {"seed": seed.double(), "cnn": cnn.double()}


@pytest.mark.filterwarnings("ignore:Full backward hook")
@pytest.mark.parametrize(("name", "groups"), [("seed", 1), ("cnn", 1), ("cnn", 2)])
def test_matches_backpack_up_to_the_mean_reduction_scale(name, groups):
    """BackPACK 1.7.1's ``BatchL2Grad`` ignores ``groups`` of a convolution (its Gram einsum
    contracts all channels); for grouped convs we compare with its ``grad_batch`` norms."""
    model = _models(groups)[name]
    ours = copy.deepcopy(model)  # BackPACK's hooks break torch.func: keep an un-extended twin
    n, sub = 16, [0, 1, 13, 7]
    x = torch.randn(n, 1, 8, 8, dtype=torch.float64)
    y = torch.randint(0, 10, (n,))
    bp_model = backpack.extend(model)
    loss = backpack.extend(nn.CrossEntropyLoss())(bp_model(x), y)
    with backpack.backpack(
        extensions.BatchL2Grad(), extensions.SumGradSquared(), extensions.Variance()
    ):
        loss.backward()
    full = {k: (p.batch_l2, p.sum_grad_squared, p.variance) for k, p in model.named_parameters()}
    model.zero_grad()
    loss = backpack.extend(nn.CrossEntropyLoss())(bp_model(x), y)
    with backpack.backpack(extensions.BatchGrad(subsampling=sub)):
        loss.backward()
    sub_grads = {k: p.grad_batch for k, p in model.named_parameters()}
    model.zero_grad()
    loss = backpack.extend(nn.CrossEntropyLoss())(bp_model(x), y)
    with backpack.backpack(extensions.BatchGrad()):
        loss.backward()
    l2_from_grads = {
        k: p.grad_batch.flatten(1).square().sum(1) for k, p in model.named_parameters()
    }
    loss_fn = sbfunc.per_sample_loss(ours, F.cross_entropy)
    params, buffers = sbfunc.split_module(ours)
    batch = (x, y)
    grads = batch_grad(loss_fn)(params, buffers, batch, subsampling=sub)
    norms = batch_l2_grad(loss_fn)(params, buffers, batch).per_param
    sgs = sum_grad_squared(loss_fn)(params, buffers, batch)
    var = variance(loss_fn)(params, buffers, batch)
    for k in params:
        torch.testing.assert_close(grads[k] / n, sub_grads[k])
        l2, bp_sgs, bp_var = full[k]
        torch.testing.assert_close(norms[k] / n**2, l2_from_grads[k])
        if groups == 1:
            torch.testing.assert_close(norms[k] / n**2, l2)
        torch.testing.assert_close(sgs[k] / n**2, bp_sgs)
        torch.testing.assert_close(var[k] / n**2, bp_var)


class _Recurrent(nn.Module):
    def __init__(self, cell):
        super().__init__()
        self.rnn = cell(3, 4, batch_first=True)
        self.flat = nn.Flatten()
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.flat(self.rnn(x)[0]))


@pytest.mark.filterwarnings("ignore:Full backward hook")
@pytest.mark.filterwarnings("ignore::sbfunc.per_sample.VmapFallbackWarning")
@pytest.mark.parametrize("cell", [nn.RNN, nn.LSTM])
def test_recurrent_grads_match_backpack(cell):
    """BackPACK 1.7.1 extends ``nn.RNN`` and ``nn.LSTM`` (``batch_first=True`` via its module
    converter; it has no ``nn.GRU`` extension), where torch's ``vmap`` fails (RNN; LSTM in
    float64): our fallback loop must agree with it."""
    torch.manual_seed(0)
    model = _Recurrent(cell).double()
    ours = copy.deepcopy(model)
    n = 5
    x = torch.randn(n, 2, 3, dtype=torch.float64)
    y = torch.randint(0, 2, (n,))
    bp_model = backpack.extend(model, use_converter=True)
    loss = backpack.extend(nn.CrossEntropyLoss())(bp_model(x), y)
    with backpack.backpack(extensions.BatchGrad()):
        loss.backward()
    bp = {
        k.removeprefix("_original_module."): p.grad_batch for k, p in bp_model.named_parameters()
    }
    loss_fn = sbfunc.per_sample_loss(ours, F.cross_entropy)
    params, buffers = sbfunc.split_module(ours)
    grads = batch_grad(loss_fn)(params, buffers, (x, y))
    assert set(grads) == set(bp)
    for k in params:
        torch.testing.assert_close(grads[k] / n, bp[k], msg=k)


@pytest.mark.filterwarnings("ignore:Full backward hook")
def test_repeated_subsampling_follows_backpack():
    """BackPACK's ``subsampling`` keeps order and repeats (row ``i`` is sample
    ``subsampling[i]``); so does ours."""
    model = _models()["cnn"]
    ours = copy.deepcopy(model)
    n, sub = 16, [7, 2, 2, 10]
    x = torch.randn(n, 1, 8, 8, dtype=torch.float64)
    y = torch.randint(0, 10, (n,))
    bp_model = backpack.extend(model)
    loss = backpack.extend(nn.CrossEntropyLoss())(bp_model(x), y)
    with backpack.backpack(extensions.BatchGrad(subsampling=sub)):
        loss.backward()
    loss_fn = sbfunc.per_sample_loss(ours, F.cross_entropy)
    grads = batch_grad(loss_fn)(*sbfunc.split_module(ours), (x, y), subsampling=sub)
    for k, p in model.named_parameters():
        assert p.grad_batch.shape[0] == len(sub)
        torch.testing.assert_close(grads[k] / n, p.grad_batch, msg=k)
