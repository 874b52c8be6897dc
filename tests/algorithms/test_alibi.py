import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import sbfunc
from sbfunc.algorithms._alibi import (
    Alibi,
    AlibiMultiheadAttention,
    ZeroEmbedding,
    alibi_bias,
    alibi_slopes,
)

common = settings(max_examples=25, deadline=None, derandomize=True, database=None)


@common
@given(st.integers(1, 40))
def test_slopes(n):
    slopes = alibi_slopes(n)
    power = 2 ** math.floor(math.log2(n))
    assert slopes.shape == (n,) and bool(((slopes > 0) & (slopes < 1)).all())
    expected = torch.tensor([2.0 ** (-8.0 * (h + 1) / power) for h in range(power)])
    torch.testing.assert_close(slopes[:power], expected)
    assert len(set(slopes.tolist())) == n


@common
@given(st.integers(1, 4), st.integers(1, 6), st.integers(0, 4))
def test_bias_is_minus_slope_times_distance(heads, lq, extra):
    slopes = alibi_slopes(heads)
    lk = lq + extra
    bias = alibi_bias(slopes, lq, lk)
    assert bias.shape == (heads, lq, lk)
    for i in range(lq):
        for j in range(lk):
            torch.testing.assert_close(bias[:, i, j], -slopes * abs(i + extra - j))


def _pair(batch_first):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 4, batch_first=batch_first)
    return mha, Alibi(16)(mha)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("masks", ["none", "padding", "causal", "bool"])
def test_alibi_attention_is_attention_with_the_bias_as_mask(batch_first, masks):
    mha, ali = _pair(batch_first)
    assert isinstance(ali, AlibiMultiheadAttention) and type(mha) is nn.MultiheadAttention
    n, length = 3, 5
    x = torch.randn(n, length, 8) if batch_first else torch.randn(length, n, 8)
    bias = alibi_bias(ali.alibi_slopes, length, length)
    kwargs, extra = {}, torch.zeros(length, length)
    future = torch.ones(length, length, dtype=torch.bool).triu(1)
    if masks == "padding":
        pad = torch.zeros(n, length, dtype=torch.bool)
        pad[0, -2:] = True
        kwargs["key_padding_mask"] = pad
    elif masks == "causal":
        kwargs.update(attn_mask=future.float().masked_fill(future, float("-inf")), is_causal=True)
        extra = kwargs["attn_mask"]
    elif masks == "bool":
        kwargs["attn_mask"] = future
        extra = torch.zeros(length, length).masked_fill(future, float("-inf"))
    out, _ = ali(x, x, x, **kwargs)
    reference = {k: v for k, v in kwargs.items() if k not in ("attn_mask", "is_causal")}
    if "key_padding_mask" in reference:
        reference["key_padding_mask"] = torch.zeros(n, length).masked_fill(pad, float("-inf"))
    full = (bias + extra).repeat(n, 1, 1)
    expected, _ = mha(x, x, x, attn_mask=full, **reference)
    torch.testing.assert_close(out, expected)


def test_zero_slopes_are_plain_attention():
    mha, ali = _pair(True)
    ali.alibi_slopes = torch.zeros(4)
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(ali(x, x, x)[0], mha(x, x, x)[0])


class TinyLM(nn.Module):
    def __init__(self, vocab=20, width=8, max_len=6):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.position_embeddings = nn.Embedding(max_len, width)
        layer = nn.TransformerEncoderLayer(width, 2, 16, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids):
        positions = torch.arange(ids.shape[1], device=ids.device)
        h = self.tokens(ids) + self.position_embeddings(positions)
        return self.head(self.encoder(h)).transpose(1, 2)  # [N, vocab, L]


def _tiny():
    torch.manual_seed(0)
    return TinyLM()


def test_surgery_on_a_small_transformer():
    model = _tiny()
    new = Alibi(max_sequence_length=32)(model)
    params, _ = sbfunc.split_module(new)
    assert "position_embeddings.weight" not in params
    assert "position_embeddings.weight" in dict(model.named_parameters())  # input untouched
    assert isinstance(new.position_embeddings, ZeroEmbedding)
    assert all(
        isinstance(layer.self_attn, AlibiMultiheadAttention) for layer in new.encoder.layers
    )
    ids = torch.randint(0, 20, (2, 10))  # longer than the old position table (6)
    with pytest.raises(IndexError):
        model(ids)
    assert new(ids).shape == (2, 20, 10)
    # eval without grad takes nn.TransformerEncoderLayer's fused path unless kept off it
    new.eval()
    with torch.no_grad():
        fast = new(ids)
    torch.testing.assert_close(fast, new(ids))
    for layer in new.encoder.layers:
        layer.self_attn.alibi_slopes = torch.zeros(2)
    assert not torch.allclose(fast, new(ids))


def test_alibi_reshapes_training_rows_before_selective_backprop():
    model = Alibi(max_sequence_length=8, train_sequence_length_scaling=0.5)(_tiny())
    alibi = Alibi(max_sequence_length=8, train_sequence_length_scaling=0.5)
    scored = []
    inner = sbfunc.per_sample_loss(model, F.cross_entropy)

    def score(params, buffers, batch):
        scored.append(tuple(batch[0].shape))
        return inner(params, buffers, batch)

    sb = sbfunc.SelectiveBackprop(
        0.0, 1.0, 0.5, interrupt=0, scoring=sbfunc.score.Scoring(loss_fn=score)
    )
    train = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    step = sbfunc.make_train_step(
        train, sbfunc.optim.sgd(0.1), [sb, alibi], sbfunc.engine.DEFAULT_PASSES
    )
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))
    ids = torch.randint(0, 20, (4, 8))
    _, metrics = step(state, (ids, ids.roll(-1, 1)))
    assert scored == [(8, 4)]  # 4 rows of 8 became 8 rows of 4, then SB scored them
    assert metrics.samples_in_batch == 4 and metrics.samples_backpropagated == 4
    # match decides from the time alone; without sequences to cut, apply changes nothing
    empty = sbfunc.Context(sbfunc.random.key(0))
    assert alibi.match(sbfunc.Event.AFTER_DATALOADER, empty)
    assert alibi.apply(sbfunc.Event.AFTER_DATALOADER, empty) is empty


def test_errors():
    with pytest.raises(ValueError, match="ALiBi would change nothing"):
        Alibi(8)(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="position_embeddings names"):
        Alibi(8, position_embeddings=["nope"])(_tiny())
    with pytest.raises(ValueError, match="train_sequence_length_scaling"):
        Alibi(8, 0.0)
    with pytest.raises(ValueError, match="max_sequence_length"):
        Alibi(0)


# ---- transformers models, built from configs (nothing downloaded) ----


def _hf(model, config, **sizes):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    return getattr(transformers, model)(getattr(transformers, config)(**sizes)).eval()


def _gpt2():
    sizes = {"n_layer": 2, "n_embd": 8, "n_head": 2, "n_positions": 16}
    return _hf(
        "GPT2LMHeadModel", "GPT2Config", vocab_size=20, bos_token_id=0, eos_token_id=0, **sizes
    )


def _bert():
    sizes = {"num_hidden_layers": 2, "hidden_size": 8, "num_attention_heads": 2}
    return _hf(
        "BertModel",
        "BertConfig",
        vocab_size=20,
        intermediate_size=16,
        max_position_embeddings=16,
        **sizes,
    )


def test_gpt2_surgery_keeps_causality_and_extrapolates():
    model = _gpt2()
    new = Alibi(64)(model)
    assert "transformer.wpe.weight" not in dict(new.named_parameters())
    assert new.config._attn_implementation == "sbfunc_alibi"
    assert model.config._attn_implementation != "sbfunc_alibi"  # the input is untouched
    ids = torch.randint(0, 20, (2, 24))  # longer than n_positions=16
    logits = new(input_ids=ids).logits
    assert logits.shape == (2, 24, 20)
    torch.testing.assert_close(new(input_ids=ids[:, :7]).logits, logits[:, :7])  # causal
    plain = Alibi(64)(model)
    plain.set_attn_implementation("eager")  # same model, no bias
    assert not torch.allclose(plain(input_ids=ids).logits, logits)


def test_gpt2_trains_in_a_step():
    model = Alibi(32)(_gpt2()).train()

    def criterion(logits, labels):
        return F.cross_entropy(logits.transpose(1, 2), labels, reduction="none")

    loss_fn = sbfunc.per_sample_loss(
        model, criterion, input="input_ids", target="labels", output="logits", mode="train"
    )
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.adam(1e-2))
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))
    ids = torch.randint(0, 20, (3, 20))
    new, metrics = step(state, {"input_ids": ids, "labels": ids.roll(-1, 1)})
    assert bool(torch.isfinite(metrics.loss))
    assert not torch.equal(
        new.params["transformer.h.0.attn.c_attn.weight"],
        state.params["transformer.h.0.attn.c_attn.weight"],
    )


def test_bert_surgery_with_padding_and_longer_sequences():
    model = _bert()
    new = Alibi(32)(model)
    assert "embeddings.position_embeddings.weight" not in dict(new.named_parameters())
    assert new.embeddings.position_ids.shape == (1, 32)
    ids = torch.randint(0, 20, (2, 24))
    mask = torch.ones(2, 24, dtype=torch.long)
    mask[1, 20:] = 0
    out = new(input_ids=ids, attention_mask=mask).last_hidden_state
    assert out.shape == (2, 24, 8) and bool(torch.isfinite(out).all())
    # padding is masked: changing padded tokens leaves the real ones' outputs unchanged
    other = ids.clone()
    other[1, 20:] = (other[1, 20:] + 1) % 20
    again = new(input_ids=other, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(again[1, :20], out[1, :20])
