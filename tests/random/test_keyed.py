import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from sbfunc import random as sbrandom
from tests.random.helpers import SETTINGS

K = sbrandom.key(7)


def call_key(i, k=K):
    return sbrandom.fold_in(k, i)


def keep_mask(i, p, shape, k=K):
    return sbrandom.bernoulli(call_key(i, k), 1 - p, shape).float()


def mlp(p=0.5):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 16), torch.nn.Dropout(p), torch.nn.ReLU(), torch.nn.Linear(16, 3)
    )


def test_dropout_model_is_reproducible_per_key_and_matches_an_explicit_mask():
    model, x = mlp(), torch.randn(5, 4)
    with sbrandom.keyed(K):
        a = model(x)
    with sbrandom.keyed(K):
        b = model(x)
    with sbrandom.keyed(sbrandom.key(8)):
        c = model(x)
    assert torch.equal(a, b) and not torch.equal(a, c)
    hidden = model[0](x) * keep_mask(0, 0.5, (5, 16)) / 0.5
    torch.testing.assert_close(a, model[3](torch.relu(hidden)))


def test_calls_are_counted_per_with_block_and_differ_within_it():
    x = torch.ones(1000)
    with sbrandom.keyed(K) as mode:
        first, second = F.dropout(x, 0.5), F.dropout(x, 0.5)
        assert mode.calls == 2
    assert not torch.equal(first, second)
    assert torch.equal(first, x * keep_mask(0, 0.5, (1000,)) / 0.5)
    assert torch.equal(second, x * keep_mask(1, 0.5, (1000,)) / 0.5)
    with mode:  # entering the same mode again restarts the count
        assert torch.equal(F.dropout(x, 0.5), first)


@SETTINGS
@given(st.sampled_from([0.1, 0.3, 0.5, 0.9]), st.integers(0, 1000))
def test_dropout_keeps_one_minus_p_and_scales(p, seed):
    x = torch.ones(20_000, dtype=torch.float64)
    with sbrandom.keyed(sbrandom.key(seed)):
        y = F.dropout(x, p)
    kept = y != 0
    assert abs(kept.double().mean() - (1 - p)) < 0.02
    assert torch.allclose(y[kept], torch.tensor(1 / (1 - p), dtype=torch.float64))


def test_dropout_edge_cases_follow_torch():
    x = torch.randn(4, 3)
    with sbrandom.keyed(K) as mode:
        assert F.dropout(x, 0.0) is x
        assert F.dropout(x, 0.5, training=False) is x
        assert torch.nn.Dropout(0.3).eval()(x) is x
        assert torch.equal(F.dropout(x, 1.0), torch.zeros_like(x))
        assert F.dropout(torch.empty(0), 0.5).numel() == 0
        assert mode.calls == 5  # calls that draw nothing still take their index
        with pytest.raises(ValueError, match=r"between 0 and 1, but got 1\.5"):
            F.dropout(x, 1.5)
        with pytest.raises(RuntimeError, match="between 0 and 1"):
            torch.dropout(x, -0.1, True)


def test_inplace_dropout_mutates_its_input_like_torch():
    x = torch.ones(50)
    with sbrandom.keyed(K):
        y = torch.nn.Dropout(0.5, inplace=True)(x)
    assert y is x
    assert torch.equal(x, keep_mask(0, 0.5, (50,)) * 2)


@pytest.mark.parametrize(
    ("fn", "shape", "noise"),
    [
        (F.dropout1d, (2, 3, 50), (2, 3, 1)),
        (F.dropout1d, (3, 50), (3, 1)),  # unbatched: (C, L)
        (F.dropout2d, (2, 3, 5, 5), (2, 3, 1, 1)),
        (F.dropout3d, (2, 3, 2, 2, 2), (2, 3, 1, 1, 1)),
        (F.dropout3d, (3, 2, 2, 2), (3, 1, 1, 1)),  # unbatched: (C, D, H, W)
    ],
)
def test_feature_dropout_masks_whole_channels(fn, shape, noise):
    x = torch.ones(shape)
    with sbrandom.keyed(K):
        y = fn(x, 0.5)
    # (an unbatched input gains a batch dim of 1: same row-major bits as drawing `noise`)
    assert torch.equal(y, x * keep_mask(0, 0.5, noise) / 0.5)


def test_module_spellings_and_torch_functions_are_keyed():
    x = torch.ones(2, 3, 4, 4)
    modules = [torch.nn.Dropout1d(0.5), torch.nn.Dropout2d(0.5), torch.nn.Dropout3d(0.5)]
    with sbrandom.keyed(K) as mode:
        modules[0](x[:, :, 0])
        modules[1](x)
        modules[2](x[None])
        torch.dropout(x, 0.5, True)
        torch.feature_dropout(x, 0.5, True)
        torch.alpha_dropout(x, 0.5, True)
        torch.nn.AlphaDropout(0.5)(x)
        torch.nn.FeatureAlphaDropout(0.5)(x)
    assert mode.calls == 8


def test_alpha_dropout_affine_correction():
    p, alpha = 0.2, 1.7580993408473766
    x = torch.randn(50_000, dtype=torch.float64)
    with sbrandom.keyed(K):
        y = F.alpha_dropout(x, p, training=True)
    keep = sbrandom.bernoulli(call_key(0), 1 - p, x.shape).double()
    a = 1 / math.sqrt((alpha**2 * p + 1) * (1 - p))
    expected = x * keep * a + (keep - 1) * alpha * a + alpha * a * p
    torch.testing.assert_close(y, expected)
    assert abs(y.mean()) < 0.03 and abs(y.var() - 1) < 0.04  # self-normalising
    with sbrandom.keyed(K):
        assert F.alpha_dropout(x, p) is x  # training defaults to False
        fa = F.feature_alpha_dropout(torch.ones(4, 25, 8), 0.5, training=True)
    per_channel = fa.reshape(100, 8)
    assert torch.equal(per_channel, per_channel[:, :1].expand(100, 8))  # whole channels
    assert per_channel[:, 0].unique().numel() == 2  # kept and dropped channels


def test_sdpa_dropout_is_keyed_math_attention():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 8) for _ in range(3))
    with sbrandom.keyed(K):
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.25, is_causal=True)
        plain = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(8)
    scores = scores.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))
    weights = torch.softmax(scores, -1) * keep_mask(0, 0.25, (2, 3, 5, 5)) / 0.75
    torch.testing.assert_close(out, weights @ v)
    assert torch.equal(plain, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_sdpa_masks_and_gqa():
    torch.manual_seed(1)
    q = torch.randn(1, 4, 3, 8)
    k, v = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    bool_mask = torch.rand(3, 6) > 0.3
    bool_mask[:, 0] = True
    with sbrandom.keyed(K):
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=bool_mask, dropout_p=0.5, enable_gqa=True, scale=0.3
        )
    kk, vv = k.repeat_interleave(2, -3), v.repeat_interleave(2, -3)
    scores = (q @ kk.transpose(-2, -1) * 0.3).masked_fill(~bool_mask, float("-inf"))
    expected = torch.softmax(scores, -1) * keep_mask(0, 0.5, (1, 4, 3, 6)) / 0.5 @ vv
    torch.testing.assert_close(out, expected)


# torch < 2.13 cannot re-enter a mode inside a Python-level torch function (sbfunc.random.keyed's
# documented limit): MultiheadAttention's own dropout, and nn.init's uniform_, stay out of reach
REENTERS = hasattr(torch.overrides, "redispatch_function")


@pytest.mark.skipif(not REENTERS, reason="torch < 2.13: keyed cannot reach attention dropout")
def test_transformer_layer_is_reproducible_including_attention_dropout():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.3, batch_first=True)
    x = torch.randn(2, 5, 8)
    with sbrandom.keyed(K) as mode:
        a = layer(x)
    with sbrandom.keyed(K):
        b = layer(x)
    assert torch.equal(a, b) and mode.calls == 4  # attention, dropout, dropout1, dropout2
    mha = torch.nn.MultiheadAttention(8, 2, dropout=0.5, batch_first=True)
    with sbrandom.keyed(K):
        w1 = mha(x, x, x, need_weights=True, average_attn_weights=False)[1]
    with sbrandom.keyed(K):
        w2 = mha(x, x, x, need_weights=True, average_attn_weights=False)[1]
    assert torch.equal(w1, w2)


def test_attention_dropout_out_of_reach_raises_instead_of_drawing_unkeyed(monkeypatch):
    from sbfunc.random import _keyed_mode as keyed_mode

    monkeypatch.setattr(keyed_mode, "_REDISPATCH", None)  # torch < 2.13 (and Dynamo)
    mha, x = torch.nn.MultiheadAttention(8, 2, dropout=0.5), torch.randn(5, 8)
    with sbrandom.keyed(K), pytest.raises(RuntimeError, match="MultiheadAttention's dropout"):
        mha(x, x, x)
    with sbrandom.keyed(K):
        mha.eval()(x, x, x)  # no dropout: fine


def test_factories_draw_from_the_call_keys():
    base = torch.zeros(2, 3, dtype=torch.float64)
    with sbrandom.keyed(K):
        r = torch.rand(2, 3)
        n = torch.randn((4,), dtype=torch.float64)
        rl = torch.rand_like(base)
        nl = torch.randn_like(base, requires_grad=True)
        b = torch.bernoulli(torch.full((6,), 0.3))
        bp = torch.ones(6).bernoulli(0.7)
        inplace = torch.zeros(6).bernoulli_(0.5)
        sized = torch.rand(size=(2,), device="meta")
    assert torch.equal(r, sbrandom.uniform(call_key(0), (2, 3)))
    assert torch.equal(n, sbrandom.normal(call_key(1), 4, dtype=torch.float64))
    assert torch.equal(rl, sbrandom.uniform(call_key(2), (2, 3), dtype=torch.float64))
    assert nl.requires_grad and torch.equal(
        nl, sbrandom.normal(call_key(3), (2, 3), dtype=base.dtype)
    )
    assert torch.equal(b, sbrandom.bernoulli(call_key(4), torch.full((6,), 0.3)).float())
    assert torch.equal(bp, sbrandom.bernoulli(call_key(5), 0.7, 6).float())
    assert torch.equal(inplace, sbrandom.bernoulli(call_key(6), 0.5, 6).float())
    assert sized.device.type == "meta" and sized.shape == (2,)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: torch.randint(0, 3, (2,)), "torch.randint"),
        (lambda: torch.multinomial(torch.ones(3), 2), "torch.multinomial"),
        (lambda: torch.randperm(4), "torch.randperm"),
        (lambda: torch.empty(3).normal_(), "torch.Tensor.normal_"),
        pytest.param(
            lambda: torch.nn.Linear(2, 2),
            "torch.Tensor.uniform_",  # nn.init, one level down
            marks=pytest.mark.skipif(not REENTERS, reason="torch < 2.13: nn.init not reached"),
        ),
        (lambda: F.rrelu(torch.ones(3), training=True), "torch.nn.functional.rrelu"),
        (lambda: F.gumbel_softmax(torch.ones(3)), "torch.nn.functional.gumbel_softmax"),
    ],
)
def test_unkeyed_random_ops_raise_naming_the_op(call, name):
    with sbrandom.keyed(K), pytest.raises(RuntimeError, match=f"{name} is random and sbfunc"):
        call()


def test_explicit_generators_and_non_random_ops_pass_through():
    model, x = mlp(0.0), torch.randn(3, 4)
    expected, normed = model(x), F.layer_norm(x, (4,))
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    with sbrandom.keyed(K) as mode:
        assert torch.equal(model(x), expected)
        assert torch.equal(F.layer_norm(x, (4,)), normed)
        assert x.unflatten(-1, (2, 2)).shape == (3, 2, 2)  # a Python-level Tensor method
        assert torch.equal(torch.rand(3, generator=g1), torch.rand(3, generator=g2))
        assert torch.equal(F.rrelu(x), F.leaky_relu(x, (1 / 8 + 1 / 3) / 2))  # eval: no noise
        assert torch.randint(0, 5, (2,), generator=g1).shape == (2,)
        assert mode.calls == 1  # only the p=0 dropout


def test_keyed_under_grad_matches_the_explicit_mask():
    model, x = mlp(), torch.randn(5, 4)
    params = dict(model.named_parameters())

    def loss(p):
        with sbrandom.keyed(K):
            return torch.func.functional_call(model, p, (x,)).square().sum()

    grads = torch.func.grad(loss)(params)
    again = torch.func.grad(loss)(params)
    mask = keep_mask(0, 0.5, (5, 16)) / 0.5
    manual = model[3](torch.relu(model[0](x) * mask)).square().sum()
    manual.backward()
    for name, g in grads.items():
        assert torch.equal(g, again[name])
        torch.testing.assert_close(g, params[name].grad)


def test_keyed_under_vmap_over_keys():
    x = torch.ones(10)
    keys = sbrandom.split(K, 3)

    def drop(k):
        with sbrandom.keyed(k):
            return F.dropout(x, 0.5)

    batched = torch.func.vmap(drop, randomness="error")(keys)
    assert torch.equal(batched, torch.stack([drop(k) for k in keys]))


def test_keyed_rejects_bad_keys():
    with pytest.raises(TypeError, match=r"k must be an int64 tensor of shape \(2,\)"):
        sbrandom.keyed(torch.tensor(0))
    assert isinstance(sbrandom.keyed(K), torch.overrides.TorchFunctionMode)
