"""Token criteria: the shift (``next_token_cross_entropy``), ignored targets, each row's mean
over its real tokens (NaN for a row without one), the mask read without logits, and a step
that trains the shipped model on corpus batches."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc import random as sbrandom
from sbfunc.models import CausalLM
from sbfunc.module import TokenCrossEntropy, next_token_cross_entropy, token_cross_entropy

SETTINGS = settings(max_examples=25, derandomize=True, database=None, deadline=None)


@SETTINGS
@given(seed=st.integers(0, 999), n=st.integers(1, 4), length=st.integers(2, 7))
def test_each_row_is_the_mean_cross_entropy_of_its_real_next_tokens(seed, n, length):
    k1, k2, k3 = sbrandom.split(sbrandom.key(seed), 3)
    logits = sbrandom.normal(k1, (n, length, 5))
    labels = sbrandom.randint(k2, (n, length), 0, 5)
    labels = torch.where(sbrandom.bernoulli(k3, 0.3, (n, length)), -100, labels)
    for criterion, shift in ((next_token_cross_entropy, 1), (token_cross_entropy, 0)):
        tokens = criterion(logits, labels)
        assert torch.equal(tokens.mask, criterion.token_mask(labels))  # from the labels alone
        got = tokens.row_means()
        for i in range(n):
            keep = labels[i, shift:] != -100
            if not keep.any():
                assert torch.isnan(got[i])
                continue
            want = F.cross_entropy(logits[i, : length - shift][keep], labels[i, shift:][keep])
            torch.testing.assert_close(got[i], want)


def test_labels_equal_to_input_ids_are_shifted_like_transformers():
    logits = sbrandom.normal(sbrandom.key(0), (2, 6, 7))
    ids = sbrandom.randint(sbrandom.key(1), (2, 6), 0, 7)
    want = F.cross_entropy(logits[:, :-1].reshape(-1, 7), ids[:, 1:].reshape(-1))
    tokens = next_token_cross_entropy(logits, ids)
    torch.testing.assert_close(tokens.masked().sum() / tokens.counts().sum(), want)


def test_the_arguments_are_checked_and_shown():
    with pytest.raises(ValueError, match="shift must be an int in"):
        TokenCrossEntropy(shift=2)
    assert repr(next_token_cross_entropy) == "next_token_cross_entropy"
    assert repr(TokenCrossEntropy(ignore_index=0)) == "token_cross_entropy(ignore_index=0)"


def test_a_step_trains_the_shipped_model_on_corpus_batches():
    corpus = sbfunc.datasets.stdlib_corpus(seq_len=32, max_bytes=20_000)
    model = CausalLM(d_model=32, num_heads=2, num_layers=1, max_len=32)
    loss_fn = sbfunc.per_sample_loss(
        model, next_token_cross_entropy, input=("input_ids", "attention_mask"), target="labels"
    )
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.adam(3e-3))
    params, buffers = sbfunc.split_module(model, clone=True)
    state = step.init(params, buffers, key=sbrandom.key(0), total_steps=6)
    batch = next(sbfunc.datasets.dict_batches(corpus.rows, 16, key=sbrandom.key(1)))
    first = loss_fn(state.params, state.buffers, batch)
    assert first.shape == (16,)
    for _ in range(6):
        state, _ = step(state, batch)
    assert float(loss_fn(state.params, state.buffers, batch).mean()) < float(first.mean())
