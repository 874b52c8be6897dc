"""Any token loss is honoured, and the usual mistakes name their fix (issue 40, items 4 and 6).

A hand-written criterion whose per-element result has the shape of its integer labels gets
``ignore_index`` applied (its ignored positions never enter a mean); one that shifts or slices
the labels itself is refused, naming ``next_token_cross_entropy``. In 1.1 such a criterion
averaged the -100 positions in as zeros (per-row losses ``[4.164, 3.663, 1.022, 5.665]``
against Hugging Face's ``[5.726, 5.756, 5.622, 5.665]``). Torch's cross-entropy on ``[N, L,
V]`` logits, a Hugging Face model's ``loss_function`` and its ``.loss`` each fail with a
message that names sbfunc's token losses and ``output="logits"``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import sbfunc

V = 7


class Tagger(nn.Module):
    """Token classification: ``[N, L]`` ids -> ``[N, L, V]`` logits (classes last)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(V, 8)
        self.head = nn.Linear(8, V)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids))


def per_position(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """A hand-written token loss: torch's cross-entropy per position, classes moved to dim 1
    (0 at an ignored position, as torch returns it)."""
    return F.cross_entropy(logits.transpose(1, 2), labels.clamp_min(0), reduction="none")


def shifted(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The issue's hand-written causal LM loss: it shifts the labels itself."""
    return F.cross_entropy(logits[:, :-1].transpose(1, 2), labels[:, 1:], reduction="none")


@st.composite
def labelled(draw):
    n, length = draw(st.integers(1, 5)), draw(st.integers(2, 8))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    ids = torch.randint(0, V, (n, length), generator=g)
    labels = torch.randint(0, V, (n, length), generator=g)
    ignored = torch.rand(n, length, generator=g) < draw(st.floats(0.0, 0.8))
    ignored[:, 0] = False  # every row keeps a real label
    return ids, labels.masked_fill(ignored, -100)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(case=labelled())
def test_a_criterions_ignored_positions_never_enter_a_mean(case):
    ids, labels = case
    model = Tagger()
    loss_fn = sbfunc.per_sample_loss(model, per_position)
    params, buffers = sbfunc.split_module(model)
    losses = loss_fn(params, buffers, (ids, labels))
    logits = model(ids)
    for i in range(len(ids)):  # each row's mean over its real labels, Hugging Face's
        expected = F.cross_entropy(logits[i], labels[i], ignore_index=-100)
        torch.testing.assert_close(losses[i], expected, rtol=1e-5, atol=1e-6)
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1))
    state = step.init(params, buffers, key=sbfunc.random.key(0))
    _, metrics = step(state, (ids, labels))  # the step's loss: the mean over real tokens
    expected = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100)
    torch.testing.assert_close(metrics.loss, expected, rtol=1e-5, atol=1e-6)
    assert int(metrics.tokens_backpropagated) == int((labels != -100).sum())


def test_a_criterion_that_shifts_its_labels_is_refused_naming_the_token_loss():
    model = Tagger()
    loss_fn = sbfunc.per_sample_loss(model, shifted)
    ids = torch.randint(0, V, (2, 5))
    labels = ids.masked_fill(torch.tensor([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]]) == 1, -100)
    with pytest.raises(ValueError, match=r"shifts or slices.*next_token_cross_entropy"):
        loss_fn(*sbfunc.split_module(model), (ids, labels))


def test_ignore_index_none_averages_every_position_as_the_criterion_returns_it():
    model = Tagger()
    loss_fn = sbfunc.per_sample_loss(model, shifted, ignore_index=None)
    ids = torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(0))
    losses = loss_fn(*sbfunc.split_module(model), (ids, ids))
    torch.testing.assert_close(losses, shifted(model(ids), ids).mean(1))


@pytest.fixture(scope="module")
def gpt2():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=2, bos_token_id=0,
        eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, 50, (4, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    batch = {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}
    return model, batch


INPUTS = ("input_ids", "attention_mask")


@pytest.mark.parametrize("criterion", [F.cross_entropy, nn.CrossEntropyLoss(reduction="none")])
def test_torchs_cross_entropy_on_class_last_logits_names_the_token_losses(gpt2, criterion):
    model, batch = gpt2
    loss_fn = sbfunc.per_sample_loss(
        model, criterion, input=INPUTS, target="labels", output="logits"
    )
    with pytest.raises(ValueError, match=r"classes last.*next_token_cross_entropy"):
        loss_fn(*sbfunc.split_module(model), batch)


def test_a_hugging_face_loss_function_is_refused_where_it_is_given(gpt2):
    model, _ = gpt2
    with pytest.raises(ValueError, match=r"Hugging Face's .*next_token_cross_entropy.*logits"):
        sbfunc.per_sample_loss(model, model.loss_function, input=INPUTS, target="labels")


def test_a_hugging_face_loss_output_names_the_logits(gpt2):
    model, batch = gpt2
    loss_fn = sbfunc.per_sample_loss(
        model, lambda loss, labels: loss.expand(labels.shape[0]),
        input=(*INPUTS, "labels"), target="labels", output="loss",
    )  # fmt: skip
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1))
    state = step.init(*sbfunc.split_module(model), key=sbfunc.random.key(0))
    with pytest.raises(ValueError, match=r"0-d tensor.*output='logits'.*next_token_cross"):
        step(state, batch)


def test_the_hugging_face_recipe_matches_its_own_loss(gpt2):
    model, batch = gpt2
    loss_fn = sbfunc.per_sample_loss(
        model, sbfunc.module.next_token_cross_entropy, input=INPUTS, target="labels",
        output="logits",
    )  # fmt: skip
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1))
    state = step.init(*sbfunc.split_module(model), key=sbfunc.random.key(0))
    _, metrics = step(state, batch)
    torch.testing.assert_close(metrics.loss, model(**batch).loss, rtol=1e-5, atol=1e-6)
