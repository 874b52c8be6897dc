"""Curvature parity with BackPACK 1.7.1 (optional: ``pip install --no-deps
backpack-for-pytorch==1.7.1 unfoldNd einops``); skipped cleanly when it is not installed."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sbfunc
from sbfunc.per_sample import (
    batch_diag_ggn_exact,
    diag_ggn_exact,
    sqrt_ggn_exact,
    sqrt_ggn_mc,
)

backpack = pytest.importorskip("backpack")
extensions = pytest.importorskip("backpack.extensions")

N = 48
SUBSETS = [[0, 1, 13, 42], [42, 0, 0, 13, 7]]  # the seed's subset; repeats, any order
CRITERIA = {"ce": (nn.CrossEntropyLoss, F.cross_entropy), "mse": (nn.MSELoss, F.mse_loss)}


def _model(name, outputs=10):
    torch.manual_seed(0)
    if name == "seed":  # BackPACK's sub-sampling example
        return nn.Sequential(nn.Flatten(), nn.Linear(784, outputs)).double()
    if name == "cnn":
        return nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(4, 4, 3, stride=2, groups=2),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(4 * 4, outputs),
        ).double()
    return nn.Sequential(
        nn.Flatten(), nn.Linear(784, 16), nn.Tanh(), nn.Linear(16, 8), nn.Sigmoid(),
        nn.Linear(8, outputs),
    ).double()  # fmt: skip


def _data(kind, outputs=10, side=28):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, 1, side, side, dtype=torch.float64, generator=g)
    if kind == "ce":
        return x, torch.randint(0, outputs, (N,), generator=g)
    return x, torch.rand(N, outputs, dtype=torch.float64, generator=g)


def _backpack(model, criterion, batch, *exts):
    """Run BackPACK's extensions on an extended copy; returns ``{name: extended module}``."""
    model = backpack.extend(copy.deepcopy(model))
    loss = backpack.extend(criterion)(model(batch[0]), batch[1])
    with backpack.backpack(*exts):
        loss.backward()
    return dict(model.named_parameters())


@pytest.mark.filterwarnings("ignore:Full backward hook")
@pytest.mark.parametrize("name", ["seed", "cnn", "mlp"])
@pytest.mark.parametrize("kind", ["ce", "mse"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_sqrt_ggn_and_diagonals_match_backpack(name, kind, reduction):
    model = _model(name)  # the un-extended model stays on the torch.func side
    batch = _data(kind, side=10 if name == "cnn" else 28)  # the CNN on 10x10 images: fast
    module_cls, fn = CRITERIA[kind]
    loss_fn = sbfunc.per_sample_loss(model, fn)
    params, buffers = sbfunc.split_module(model)
    for sub in SUBSETS:
        bp = _backpack(
            model,
            module_cls(reduction=reduction),
            batch,
            extensions.SqrtGGNExact(subsampling=sub),
            extensions.SqrtGGNMC(mc_samples=3, subsampling=sub),
        )
        ours = sqrt_ggn_exact(loss_fn, reduction=reduction)(
            params, buffers, batch, subsampling=sub
        )
        mc = sqrt_ggn_mc(loss_fn, mc_samples=3, reduction=reduction)(
            params, buffers, batch, key=sbfunc.random.key(0), subsampling=sub, chunk_size=16
        )
        for k, p in bp.items():
            torch.testing.assert_close(ours[k], p.sqrt_ggn_exact)
            assert mc[k].shape == p.sqrt_ggn_mc.shape
    bp = _backpack(
        model,
        module_cls(reduction=reduction),
        batch,
        extensions.DiagGGNExact(),
        extensions.BatchDiagGGNExact(),
    )
    diag = diag_ggn_exact(loss_fn, reduction=reduction)(params, buffers, batch, chunk_size=20)
    rows = batch_diag_ggn_exact(loss_fn, reduction=reduction)(params, buffers, batch)
    sub_rows = batch_diag_ggn_exact(loss_fn, reduction=reduction)(
        params, buffers, batch, subsampling=SUBSETS[1]
    )
    for k, p in bp.items():
        torch.testing.assert_close(diag[k], p.diag_ggn_exact)
        torch.testing.assert_close(rows[k], p.diag_ggn_exact_batch)
        torch.testing.assert_close(sub_rows[k], p.diag_ggn_exact_batch[SUBSETS[1]])


@pytest.mark.filterwarnings("ignore:Full backward hook")
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_bce_with_logits_matches_backpack(reduction):
    """BackPACK's ``BCEWithLogitsLoss`` takes scalar predictions ``[N, 1]`` only."""
    model = _model("mlp", outputs=1)
    x, y = _data("mse", outputs=1)
    loss_fn = sbfunc.per_sample_loss(model, F.binary_cross_entropy_with_logits)
    sub = [3, 0, 3]
    bp = _backpack(
        model,
        nn.BCEWithLogitsLoss(reduction=reduction),
        (x, y),
        extensions.SqrtGGNExact(subsampling=sub),
    )
    ours = sqrt_ggn_exact(loss_fn, reduction=reduction)(
        *sbfunc.split_module(model), (x, y), subsampling=sub
    )
    for k, p in bp.items():
        torch.testing.assert_close(ours[k], p.sqrt_ggn_exact)


@pytest.mark.filterwarnings("ignore:Full backward hook")
def test_layout_of_the_issue_example():
    """``subsampling=[0, 3, 3]`` on a ``Linear(5, 3)`` with cross-entropy: ``[3, 3, 3, 5]``."""
    model = nn.Linear(5, 3).double()
    batch = (torch.randn(4, 5, dtype=torch.float64), torch.tensor([0, 1, 2, 0]))
    bp = _backpack(
        model, nn.CrossEntropyLoss(), batch, extensions.SqrtGGNExact(subsampling=[0, 3, 3])
    )
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    ours = sqrt_ggn_exact(loss_fn)(*sbfunc.split_module(model), batch, subsampling=[0, 3, 3])
    assert ours["weight"].shape == bp["weight"].sqrt_ggn_exact.shape == (3, 3, 3, 5)
    torch.testing.assert_close(ours["weight"], bp["weight"].sqrt_ggn_exact)
