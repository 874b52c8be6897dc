"""One meaning of ``subsampling`` across ``sbfunc.per_sample`` (BackPACK's): order and repeats
kept, row ``i`` of a result is sample ``subsampling[i]``; and the params and buffers given to a
transform are checked against the module behind the loss before any forward."""

import functools

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import sbfunc
from sbfunc.per_sample import (
    batch_diag_ggn_exact,
    batch_diag_ggn_mc,
    batch_grad,
    batch_l2_grad,
    diag_ggn_exact,
    diag_ggn_mc,
    ggn_eigen,
    ggn_vector_product,
    sqrt_ggn_exact,
    sqrt_ggn_mc,
    sum_grad_squared,
    variance,
)

N = 12
SUB = [7, 2, 2, 10]


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double()


@functools.cache
def _setup():
    model = _model()
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    g = torch.Generator().manual_seed(0)
    batch = (torch.randn(N, 5, generator=g).double(), torch.randint(0, 3, (N,), generator=g))
    params, buffers = sbfunc.split_module(model)
    grads = batch_grad(loss_fn)(params, buffers, batch)  # [N, *shape]
    factors = sqrt_ggn_exact(loss_fn)(params, buffers, batch)  # [C, N, *shape]
    return loss_fn, params, buffers, batch, grads, factors


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def _expected(which, idx, v=None):
    """The result for ``subsampling=idx`` from the full-batch results indexed by ``idx``."""
    *_, grads, factors = _setup()
    g = {k: t[idx] for k, t in grads.items()}
    f = {k: t[:, idx] for k, t in factors.items()}
    if which == "grad":
        return g
    if which == "l2":
        return {k: t.flatten(1).square().sum(1) for k, t in g.items()}
    if which == "sgs":
        return {k: t.square().sum(0) for k, t in g.items()}
    if which == "var":
        return {k: t.var(0, unbiased=False) for k, t in g.items()}
    if which == "sqrt":
        return f
    if which == "batch_diag":
        return {k: t.square().sum(0) for k, t in f.items()}
    if which == "diag":
        return {k: t.square().sum((0, 1)) for k, t in f.items()}
    coef = sum(torch.einsum("rn...,...->rn", f[k], v[k]) for k in f)  # gvp
    return {k: torch.einsum("rn,rn...->...", coef, t) for k, t in f.items()}


def _computed(which, idx, chunk_size=None, v=None):
    loss_fn, params, buffers, batch, *_ = _setup()
    kw = {"subsampling": idx, "chunk_size": chunk_size}
    if which == "l2":
        return batch_l2_grad(loss_fn)(params, buffers, batch, **kw).per_param
    if which == "gvp":
        return ggn_vector_product(loss_fn)(params, buffers, batch, v, **kw)
    make = {
        "grad": batch_grad,
        "sgs": sum_grad_squared,
        "var": variance,
        "sqrt": sqrt_ggn_exact,
        "batch_diag": batch_diag_ggn_exact,
        "diag": diag_ggn_exact,
    }[which]
    return make(loss_fn)(params, buffers, batch, **kw)


WHICH = ["grad", "l2", "sgs", "var", "sqrt", "batch_diag", "diag", "gvp"]


def _vector():
    params = _setup()[1]
    g = torch.Generator().manual_seed(1)
    return {k: torch.randn(p.shape, generator=g, dtype=p.dtype) for k, p in params.items()}


@pytest.mark.parametrize("which", WHICH)
@pytest.mark.parametrize("as_tensor", [False, True])
def test_every_exact_transform_keeps_order_and_repeats(which, as_tensor):
    v = _vector() if which == "gvp" else None
    idx = torch.tensor(SUB) if as_tensor else SUB
    got, want = _computed(which, idx, v=v), _expected(which, SUB, v)
    assert list(got) == list(want)
    for k in want:
        close(got[k], want[k])


def test_batch_l2_total_and_eigenpairs_keep_order_and_repeats():
    loss_fn, params, buffers, batch, grads, factors = _setup()
    total = batch_l2_grad(loss_fn)(params, buffers, batch, subsampling=SUB).total
    close(total, sum(g[SUB].flatten(1).square().sum(1) for g in grads.values()))
    eig = ggn_eigen(loss_fn, k=3)(params, buffers, batch, subsampling=SUB)
    v = torch.cat([f[:, SUB].flatten(2) for f in factors.values()], dim=2).flatten(0, 1)
    close(eig.eigenvalues, torch.linalg.eigvalsh(v @ v.T).flip(0)[:3])


@pytest.mark.parametrize(
    "make",
    [
        lambda loss: sqrt_ggn_mc(loss, mc_samples=3, reduction="sum"),
        lambda loss: batch_diag_ggn_mc(loss, mc_samples=3, reduction="sum"),
        lambda loss: diag_ggn_mc(loss, mc_samples=3, reduction="sum"),
        lambda loss: ggn_eigen(loss, k=2, mc_samples=3, reduction="sum"),
    ],
    ids=["sqrt_ggn_mc", "batch_diag_ggn_mc", "diag_ggn_mc", "ggn_eigen_mc"],
)
def test_monte_carlo_transforms_run_sample_subsampling_i_at_row_i(make):
    """Draws follow the positions of ``subsampling``, so the sub-sampled result equals the
    result on the batch ``take(batch, SUB)`` with the same key (``"sum"``: no weight on N)."""
    loss_fn, params, buffers, batch, *_ = _setup()
    f, key = make(loss_fn), sbfunc.random.key(3)
    got = f(params, buffers, batch, key=key, subsampling=SUB)
    want = f(params, buffers, sbfunc.batch.take(batch, torch.tensor(SUB)), key=key)
    for a, b in zip(
        torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want), strict=True
    ):
        close(a, b)


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(
    which=st.sampled_from(WHICH),
    idx=st.lists(st.integers(0, N - 1), min_size=1, max_size=8),
    chunk_size=st.one_of(st.none(), st.integers(1, 5)),
)
def test_subsampling_with_repeats_equals_the_full_result_indexed(which, idx, chunk_size):
    v = _vector() if which == "gvp" else None
    got, want = _computed(which, idx, chunk_size, v), _expected(which, idx, v)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("which", WHICH)
@pytest.mark.parametrize(
    ("idx", "error", "match"),
    [
        ([7, 2, 12], ValueError, r"subsampling\[2\] = 12 is out of range for a batch of 12 "),
        (torch.tensor([-1, 3]), ValueError, r"subsampling\[0\] = -1 .* in \[0, 12\)"),
        ([], ValueError, "non-empty 1-D"),
        ([[0, 1]], ValueError, "1-D"),
        ([0.0, 1.0], TypeError, "integer"),
    ],
    ids=["past_the_end", "negative", "empty", "2d", "float"],
)
def test_bad_indices_say_why_alike_everywhere(which, idx, error, match):
    v = _vector() if which == "gvp" else None
    with pytest.raises(error, match=match):
        _computed(which, idx, v=v)


# --- params and buffers of another model --------------------------------------------------------


def _all_transforms(loss_fn):
    key = sbfunc.random.key(0)
    mc = sqrt_ggn_mc(loss_fn)
    gvp = ggn_vector_product(loss_fn)
    return {
        "batch_grad": batch_grad(loss_fn),
        "batch_l2_grad": batch_l2_grad(loss_fn),
        "sum_grad_squared": sum_grad_squared(loss_fn),
        "variance": variance(loss_fn),
        "sqrt_ggn_exact": sqrt_ggn_exact(loss_fn),
        "sqrt_ggn_mc": lambda p, b, x, **kw: mc(p, b, x, key=key, **kw),
        "diag_ggn_exact": diag_ggn_exact(loss_fn),
        "batch_diag_ggn_exact": batch_diag_ggn_exact(loss_fn),
        "ggn_eigen": ggn_eigen(loss_fn, k=1),
        "ggn_vector_product": lambda p, b, x, **kw: gvp(p, b, x, p, **kw),
    }


TRANSFORMS = [
    "batch_grad",
    "batch_l2_grad",
    "sum_grad_squared",
    "variance",
    "sqrt_ggn_exact",
    "sqrt_ggn_mc",
    "diag_ggn_exact",
    "batch_diag_ggn_exact",
    "ggn_eigen",
    "ggn_vector_product",
]


@pytest.mark.parametrize("name", TRANSFORMS)
def test_params_of_another_model_are_refused_before_any_forward(name):
    model = _model()
    calls = []
    model.register_forward_pre_hook(lambda m, args: calls.append(1))
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    batch = _setup()[3]
    f = _all_transforms(loss_fn)[name]
    other = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 3))
    with pytest.raises(ValueError, match=r"unexpected \['4\.weight', '4\.bias'\]"):
        f(*sbfunc.split_module(other.double()), batch, subsampling=SUB)
    wrong = {k: torch.zeros(t.shape[0] + 1) for k, t in model.named_parameters()}
    with pytest.raises(ValueError, match=r"shape mismatch \{'0\.weight': \(5,\) given"):
        f(wrong, {}, batch)
    assert calls == []  # refused on the host, before the module ran
    f(*sbfunc.split_module(model), batch, subsampling=SUB)  # its own dicts are fine
    assert calls
