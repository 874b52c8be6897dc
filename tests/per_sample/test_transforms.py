import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import sbfunc
from sbfunc.per_sample import batch_grad, batch_l2_grad, sum_grad_squared, variance
from tests.per_sample.helpers import NAMES, loop_grads, setup

SETTINGS = settings(derandomize=True, max_examples=15, deadline=None)


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_all_quantities_match_the_autograd_loop(name):
    loss_fn, params, buffers, batch = setup(name)
    ref = loop_grads(loss_fn, params, buffers, batch)
    grads = batch_grad(loss_fn)(params, buffers, batch)
    norms = batch_l2_grad(loss_fn)(params, buffers, batch)
    sgs = sum_grad_squared(loss_fn)(params, buffers, batch)
    var = variance(loss_fn)(params, buffers, batch)
    assert list(grads) == list(params) == list(norms.per_param) == list(sgs) == list(var)
    for k, g in ref.items():
        close(grads[k], g)
        close(norms.per_param[k], g.flatten(1).square().sum(1))
        close(sgs[k], g.square().sum(0))
        close(var[k], g.var(0, unbiased=False))
    total = sum(g.flatten(1).square().sum(1) for g in ref.values())
    close(norms.total, total)


def _transforms(loss_fn, wrt=None):
    l2 = batch_l2_grad(loss_fn, wrt=wrt)
    return {
        "grad": batch_grad(loss_fn, wrt=wrt),
        "l2": lambda *a, **k: l2(*a, **k).per_param,
        "l2_total": lambda *a, **k: {"total": l2(*a, **k).total},
        "sgs": sum_grad_squared(loss_fn, wrt=wrt),
        "var": variance(loss_fn, wrt=wrt),
    }


@SETTINGS
@given(
    name=st.sampled_from(NAMES),
    indices=st.lists(st.integers(0, 5), min_size=1, max_size=6),  # order and repeats kept
)
def test_subsampled_equals_full_then_sliced(name, indices):
    loss_fn, params, buffers, batch = setup(name)
    full = batch_grad(loss_fn)(params, buffers, batch)
    sub = batch_grad(loss_fn)(params, buffers, batch, subsampling=indices)
    sub_t = batch_grad(loss_fn)(params, buffers, batch, subsampling=torch.tensor(indices))
    for k, g in full.items():
        close(sub[k], g[indices])
        close(sub_t[k], g[indices])
    ref = loop_grads(loss_fn, params, buffers, batch, indices=indices)
    var = variance(loss_fn)(params, buffers, batch, subsampling=indices)
    for k, g in ref.items():
        close(var[k], g.var(0, unbiased=False))


@SETTINGS
@given(
    name=st.sampled_from(NAMES),
    chunk=st.integers(1, 7),
    which=st.sampled_from(["grad", "l2", "l2_total", "sgs", "var"]),
    subsample=st.booleans(),
)
def test_chunked_equals_unchunked(name, chunk, which, subsample):
    loss_fn, params, buffers, batch = setup(name)
    f = _transforms(loss_fn)[which]
    sub = [4, 0, 5, 2] if subsample else None
    whole = f(params, buffers, batch, subsampling=sub)
    chunked = f(params, buffers, batch, subsampling=sub, chunk_size=chunk)
    for k, v in whole.items():
        close(chunked[k], v)


@SETTINGS
@given(
    name=st.sampled_from(NAMES),
    which=st.sampled_from(["grad", "l2", "sgs", "var"]),
    data=st.data(),
)
def test_frozen_params_are_excluded_and_the_rest_unchanged(name, which, data):
    loss_fn, params, buffers, batch = setup(name)
    wrt = data.draw(st.lists(st.sampled_from(list(params)), min_size=1, unique=True))
    full = _transforms(loss_fn)[which](params, buffers, batch)
    part = _transforms(loss_fn, wrt)[which](params, buffers, batch)
    assert list(part) == [k for k in params if k in wrt]
    for k, v in part.items():
        close(v, full[k])


def test_wrt_accepts_module_prefixes():
    loss_fn, params, buffers, batch = setup("mixed")
    grads = batch_grad(loss_fn, wrt=["conv", "head.bias"])(params, buffers, batch)
    assert list(grads) == ["conv.weight", "conv.bias", "head.bias"]


def test_inputs_are_not_mutated_and_grad_mode_is_irrelevant():
    loss_fn, params, buffers, batch = setup("cnn")
    before = {k: v.clone() for k, v in params.items()}
    x_before = batch[0].clone()
    with torch.no_grad():
        grads = batch_grad(loss_fn)(params, buffers, batch)
    assert all(not g.requires_grad for g in grads.values())
    assert all(not v.requires_grad for v in params.values())
    for k, v in before.items():
        assert torch.equal(params[k], v)
    assert torch.equal(batch[0], x_before)


def test_dict_batches_with_metadata():
    torch.manual_seed(0)
    model = nn.Linear(3, 2).double()
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, input="x", target="y")
    params, buffers = sbfunc.split_module(model)
    batch = {"x": torch.randn(5, 3).double(), "y": torch.tensor([0, 1, 1, 0, 1]), "tag": "a"}
    ref = loop_grads(loss_fn, params, buffers, batch)
    grads = batch_grad(loss_fn)(params, buffers, batch, subsampling=[1, 3])
    close(grads["weight"], ref["weight"][[1, 3]])


@pytest.mark.parametrize(
    ("subsampling", "error", "match"),
    [
        ([0, 6], ValueError, r"in \[0, 6\)"),
        ([-1], ValueError, r"in \[0, 6\)"),
        ([], ValueError, "non-empty"),
        ([[0, 1]], ValueError, "1-D"),
        ([0.0, 1.0], TypeError, "integer"),
        ([True], TypeError, "integer"),
    ],
)
def test_bad_subsampling_indices(subsampling, error, match):
    loss_fn, params, buffers, batch = setup("seed")
    with pytest.raises(error, match=match):
        batch_grad(loss_fn)(params, buffers, batch, subsampling=subsampling)


@pytest.mark.parametrize(
    ("chunk_size", "error"),
    [(0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError)],
)
def test_bad_chunk_size(chunk_size, error):
    loss_fn, params, buffers, batch = setup("seed")
    with pytest.raises(error, match="chunk_size"):
        batch_grad(loss_fn)(params, buffers, batch, chunk_size=chunk_size)


def test_bad_construction_arguments():
    loss_fn, params, buffers, batch = setup("seed")
    with pytest.raises(TypeError, match="loss_fn"):
        batch_grad(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="wrt"):
        batch_grad(loss_fn, wrt="1.weight")
    with pytest.raises(ValueError, match="wrt"):
        batch_grad(loss_fn, wrt=[])
    with pytest.raises(ValueError, match="matches no parameter"):
        batch_grad(loss_fn, wrt=["nope"])(params, buffers, batch)


def test_loss_that_is_not_per_sample():
    loss_fn, params, buffers, batch = setup("seed")
    with pytest.raises(ValueError, match="per-sample"):
        batch_grad(lambda p, b, x: loss_fn(p, b, x).mean())(params, buffers, batch)
    with pytest.raises(ValueError, match="leading dimension"):
        batch_grad(lambda p, b, x: loss_fn(p, b, x)[:2])(params, buffers, batch)


def test_train_mode_batch_norm_is_refused_with_a_fix():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    params, buffers = sbfunc.split_module(model, clone=True)
    loss_fn = sbfunc.per_sample_loss(model, F.mse_loss, mode="train")
    batch = (torch.randn(5, 3), torch.randn(5, 4))
    with pytest.raises(ValueError, match=r"mode='eval'.*replace_all_batch_norm_modules_"):
        batch_grad(loss_fn)(params, buffers, batch)
    eval_loss = sbfunc.per_sample_loss(model, F.mse_loss, mode="eval")
    # eval mode with running statistics is per-sample
    assert batch_grad(eval_loss)(params, buffers, batch)["1.weight"].shape == (5, 4)


def test_batch_norm_without_running_stats_normalizes_each_sample_alone():
    """After torch.func.replace_all_batch_norm_modules_, every quantity matches a loop that runs
    each sample as a batch of one (vmap semantics), not the coupled batch forward."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.Flatten(), nn.Linear(12, 2)
    ).double()
    torch.func.replace_all_batch_norm_modules_(model)
    params, buffers = sbfunc.split_module(model)
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    batch = (torch.randn(5, 1, 4, 4, dtype=torch.float64), torch.tensor([0, 1, 1, 0, 1]))
    ref = loop_grads(loss_fn, params, buffers, batch)
    got = batch_grad(loss_fn)(params, buffers, batch, subsampling=[4, 1])
    for k, v in ref.items():
        close(got[k], v[[4, 1]])
