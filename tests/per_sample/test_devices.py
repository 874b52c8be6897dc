"""Every public transform of :mod:`sbfunc.per_sample` on the ``meta`` device (tensors without
data: a host read or a device mix raises there): per-sample gradients, their norms and
moments, the GGN's square root, diagonals, eigenpairs and products, for every loss the
curvature supports, whole, sub-sampled and chunked. None reads the device; indices given as a
device tensor are read once, to check their range (docs/how-to/compile.md)."""

from __future__ import annotations

import functools

import optree
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sbfunc
from sbfunc import per_sample as ps
from tests.meta import META, all_meta, empty, host_read, sync_site, to_meta

N, C = 8, 3
CPU = torch.device("cpu")
SUB = [5, 1, 1, 6]  # order and repeats kept
KEY = sbfunc.random.key(0)
LOSSES = {  # loss, targets of N rows
    "ce": (F.cross_entropy, torch.zeros(N, dtype=torch.int64)),
    "mse": (F.mse_loss, torch.zeros(N, C)),
    "bce": (F.binary_cross_entropy_with_logits, torch.zeros(N, C)),
}


def _plain(make):
    return lambda loss_fn, key: make(loss_fn)


def _keyed(make):
    return lambda loss_fn, key: functools.partial(make(loss_fn), key=key)


def _gvp(loss_fn, key):  # the product with the parameters themselves
    return lambda p, b, x, **kw: ps.ggn_vector_product(loss_fn)(p, b, x, p, **kw)


TRANSFORMS = {  # name -> (loss_fn, key) -> f(params, buffers, batch, **subsampling and chunks)
    "batch_grad": _plain(ps.batch_grad),
    "batch_l2_grad": _plain(ps.batch_l2_grad),
    "sum_grad_squared": _plain(ps.sum_grad_squared),
    "variance": _plain(ps.variance),
    "sqrt_ggn_exact": _plain(ps.sqrt_ggn_exact),
    "sqrt_ggn_mc": _keyed(lambda loss_fn: ps.sqrt_ggn_mc(loss_fn, mc_samples=2)),
    "diag_ggn_exact": _plain(ps.diag_ggn_exact),
    "diag_ggn_mc": _keyed(ps.diag_ggn_mc),
    "batch_diag_ggn_exact": _plain(ps.batch_diag_ggn_exact),
    "batch_diag_ggn_mc": _keyed(ps.batch_diag_ggn_mc),
    "ggn_eigen": _plain(lambda loss_fn: ps.ggn_eigen(loss_fn, k=2)),
    "ggn_eigen_mc": _keyed(lambda loss_fn: ps.ggn_eigen(loss_fn, k=2, mc_samples=2)),
    "ggn_vector_product": _gvp,
}
CURVATURE = {n for n in TRANSFORMS if "ggn" in n}  # the loss's Hessian enters
TYPES = {"GGNEigen", "PerSampleTransform", "SquaredNorms"}
WARNINGS = {"VmapFallbackWarning"}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(  # conv and linear layers, and a LayerNorm (the vmap fallback)
        nn.Conv2d(1, 2, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(32, 4),
        nn.LayerNorm(4),
        nn.Tanh(),
        nn.Linear(4, C),
    )


def _run(name, loss, device, **kwargs):
    model = _model()
    loss_fn = sbfunc.per_sample_loss(model, LOSSES[loss][0])
    params, buffers = sbfunc.split_module(model, clone=True)
    batch = (torch.zeros(N, 1, 4, 4), LOSSES[loss][1])
    if device == META:
        params, buffers, batch = to_meta((params, buffers, batch))
    f = TRANSFORMS[name](loss_fn, KEY.to(device))
    return f(params, buffers, batch, **kwargs)


def _shapes(tree):
    return optree.tree_map(
        lambda x: (x.shape, x.dtype) if isinstance(x, torch.Tensor) else x, tree
    )


def test_every_public_transform_is_covered():
    assert (TRANSFORMS.keys() - {"ggn_eigen_mc"}) | TYPES | WARNINGS == set(ps.__all__)


@pytest.mark.filterwarnings("ignore::sbfunc.per_sample.VmapFallbackWarning")
@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_every_transform_runs_on_meta_as_on_the_cpu(name):
    sub = {"subsampling": SUB, "chunk_size": 3}
    for kwargs in [{}, sub, {"subsampling": torch.tensor(SUB)}]:  # indices on the host
        assert all_meta(_run(name, "ce", META, **kwargs))
    assert _shapes(_run(name, "ce", META, **sub)) == _shapes(_run(name, "ce", CPU, **sub))


@pytest.mark.filterwarnings("ignore::sbfunc.per_sample.VmapFallbackWarning")
@pytest.mark.parametrize("loss", sorted(LOSSES.keys() - {"ce"}))
@pytest.mark.parametrize("name", sorted(CURVATURE))
def test_the_curvature_of_every_loss_runs_on_meta(name, loss):
    assert all_meta(_run(name, loss, META, subsampling=SUB))


@pytest.mark.filterwarnings("ignore::sbfunc.per_sample.VmapFallbackWarning")
@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_indices_on_the_device_are_read_once_for_the_range_check(name):
    with host_read() as error:
        _run(name, "ce", META, subsampling=empty(len(SUB), dtype=torch.int64))
    assert sync_site(error.value) == ("per_sample/_engine.py", "check_subsampling")
