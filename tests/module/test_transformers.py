"""Hugging Face models through ``per_sample_loss`` (optional: ``pip install transformers``; a
model built from a small config, nothing is downloaded). Skipped cleanly without transformers."""

import warnings

import pytest
import torch
import torch.nn.functional as F

import sbfunc
from sbfunc.per_sample import VmapFallbackWarning, batch_grad
from tests.per_sample.helpers import loop_grads

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def bert():
    config = transformers.BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=3,
        hidden_dropout_prob=0.1,
    )
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(config).double()


def _batch(n=4):
    gen = torch.Generator().manual_seed(1)
    mask = torch.ones(n, 7, dtype=torch.long)
    mask[0, 4:] = 0
    mask[2, 6:] = 0
    return {
        "input_ids": torch.randint(1, 50, (n, 7), generator=gen),
        "attention_mask": mask,
        "labels": torch.randint(0, 3, (n,), generator=gen),
        "text": [f"sentence number {i}" for i in range(n)],  # a string field, as collated
    }


def _loss_fn(model, **kw):
    return sbfunc.per_sample_loss(
        model,
        F.cross_entropy,
        input=("input_ids", "attention_mask"),
        target="labels",
        output="logits",
        **kw,
    )


def test_scores_match_the_model_and_follow_take(bert):
    loss_fn = _loss_fn(bert)
    params, buffers = sbfunc.split_module(bert)
    batch = _batch()
    bert.eval()
    with torch.no_grad():
        logits = bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    ref = F.cross_entropy(logits, batch["labels"], reduction="none")
    with torch.no_grad():
        scores = loss_fn(params, buffers, batch)
    torch.testing.assert_close(scores, ref)
    kept = sbfunc.batch.take(batch, torch.tensor([3, 1]))
    assert kept["text"] == ["sentence number 3", "sentence number 1"]
    with torch.no_grad():
        torch.testing.assert_close(loss_fn(params, buffers, kept), ref[[3, 1]])


def test_grad_of_the_mean_loss_matches_autograd(bert):
    loss_fn = _loss_fn(bert)  # eval mode: dropout off, so autograd sees the same function
    params, buffers = sbfunc.split_module(bert)
    batch = _batch()
    grads = torch.func.grad(lambda p: loss_fn(p, buffers, batch).mean())(params)
    bert.eval()
    bert.zero_grad()
    out = bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    F.cross_entropy(out.logits, batch["labels"]).backward()
    for name, p in bert.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, msg=name)
    bert.zero_grad()


def test_forward_returns_logits_for_vjp(bert):
    loss_fn = _loss_fn(bert, mode="train")
    params, buffers = sbfunc.split_module(bert)
    torch.manual_seed(0)
    logits, pullback = torch.func.vjp(lambda p: loss_fn.forward(p, buffers, _batch()), params)
    assert logits.shape == (4, 3)
    (grads,) = pullback(torch.ones_like(logits))
    assert grads["classifier.weight"].shape == (3, 16)


def test_per_sample_grads_fall_back_to_a_loop(bert):
    loss_fn = _loss_fn(bert)
    params, buffers = sbfunc.split_module(bert)
    batch = _batch(3)
    names = ["bert.embeddings.word_embeddings.weight", "bert.encoder.layer.1", "classifier"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        grads = batch_grad(loss_fn, wrt=names)(params, buffers, batch)
    fallback = [w for w in caught if issubclass(w.category, VmapFallbackWarning)]
    assert fallback and "vmap failed in" in str(fallback[0].message)
    ref = loop_grads(loss_fn, params, buffers, batch, names=list(grads))
    for k in grads:
        torch.testing.assert_close(grads[k], ref[k], msg=k)
