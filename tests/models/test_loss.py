"""next_token_loss: the shift, ignored targets, reductions, and use as a per-sample
criterion in a training step on the corpus."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc import random as sbrandom
from sbfunc.models import CausalLM, next_token_loss

SETTINGS = settings(max_examples=25, derandomize=True, database=None, deadline=None)


@SETTINGS
@given(seed=st.integers(0, 999), n=st.integers(1, 4), length=st.integers(2, 7))
def test_each_row_is_the_mean_cross_entropy_of_its_next_tokens(seed, n, length):
    k1, k2, k3 = sbrandom.split(sbrandom.key(seed), 3)
    logits = sbrandom.normal(k1, (n, length, 5))
    labels = sbrandom.randint(k2, (n, length), 0, 5)
    labels = torch.where(sbrandom.bernoulli(k3, 0.3, (n, length)), -100, labels)
    got = next_token_loss(logits, labels)
    for i in range(n):
        keep = labels[i, 1:] != -100
        want = (
            F.cross_entropy(logits[i, :-1][keep], labels[i, 1:][keep])
            if keep.any()
            else torch.tensor(0.0)
        )
        torch.testing.assert_close(got[i], want)
    torch.testing.assert_close(next_token_loss(logits, labels, reduction="sum"), got.sum())
    torch.testing.assert_close(next_token_loss(logits, labels, reduction="mean"), got.mean())


def test_labels_equal_to_input_ids_are_shifted_like_transformers():
    logits = sbrandom.normal(sbrandom.key(0), (2, 6, 7))
    ids = sbrandom.randint(sbrandom.key(1), (2, 6), 0, 7)
    want = F.cross_entropy(logits[:, :-1].reshape(-1, 7), ids[:, 1:].reshape(-1))
    torch.testing.assert_close(next_token_loss(logits, ids, reduction="mean"), want)


def test_reduction_is_validated():
    with pytest.raises(ValueError, match="reduction must be one of"):
        next_token_loss(torch.zeros(1, 2, 3), torch.zeros(1, 2, dtype=torch.long), reduction="x")


def test_a_step_trains_the_model_on_corpus_batches():
    corpus = sbfunc.datasets.stdlib_corpus(seq_len=32, max_bytes=20_000)
    model = CausalLM(d_model=32, num_heads=2, num_layers=1, max_len=32)
    loss_fn = sbfunc.per_sample_loss(
        model, next_token_loss, input=("input_ids", "attention_mask"), target="labels"
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
