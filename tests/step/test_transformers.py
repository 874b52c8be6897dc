"""A tiny Hugging Face BERT classifier trained with Selective Backprop through the step, eagerly
and through ``torch.compile(step)``, on dict batches with a string field (optional: ``pip
install transformers``; the model is built from a config, nothing is downloaded).

The compiled test is the one slow test here (it compiles a 2-layer BERT: minutes on a 2-core
CPU); the rest run in seconds.
"""

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch._dynamo.utils import counters

import sbfunc

transformers = pytest.importorskip("transformers")

N, SEQ, VOCAB, LABELS = 8, 8, 50, 3
TEXTS = [f"sentence number {j}" for j in range(N)]


def _bert():
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=16,
        num_labels=LABELS,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,  # SDPA's dropout, keyed by sbfunc.random.keyed
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(config)


def _batch(i, texts=None):
    gen = torch.Generator().manual_seed(i)
    mask = torch.ones(N, SEQ, dtype=torch.long)
    mask[0, 5:] = 0  # a padded row
    ids = torch.randint(1, VOCAB, (N, SEQ), generator=gen)
    ids[:, 0] = torch.arange(N) + 1  # the row's number, to check alignment with "text"
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "labels": torch.randint(0, LABELS, (N,), generator=gen),
        "text": list(TEXTS if texts is None else texts),  # default_collate's list of strings
    }


def _build():
    bert = _bert()
    loss_fn = sbfunc.per_sample_loss(
        bert,
        F.cross_entropy,
        input=("input_ids", "attention_mask"),
        target="labels",
        output="logits",
        mode="train",
    )
    sb = sbfunc.SelectiveBackprop(  # rank_power, half of every batch
        0.0, 1.0, keep=0.5, interrupt=0, scoring=sbfunc.score.Scoring(input="input_ids")
    )
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.adamw(1e-3), [sb])
    state = step.init(*sbfunc.split_module(bert, clone=True), key=sbfunc.random.key(0))
    return loss_fn, sb, step, state


@pytest.fixture(scope="module")
def built():
    return _build()


def _assert_close(a, b):
    for name in a.params:
        torch.testing.assert_close(a.params[name], b.params[name], rtol=1e-5, atol=1e-6)
    for name in a.buffers:
        torch.testing.assert_close(a.buffers[name], b.buffers[name], rtol=1e-5, atol=1e-6)


def test_keyed_dropout_through_the_model(built):
    loss_fn, _, step, state = built
    assert step.keyed_model  # BERT has dropout: the step keys it
    batch = _batch(0)

    def losses(k):
        with sbfunc.random.keyed(k):
            return loss_fn(state.params, state.buffers, batch)

    torch.manual_seed(1)
    first = losses(sbfunc.random.key(7))
    torch.manual_seed(2)  # torch's global generator plays no part
    torch.testing.assert_close(losses(sbfunc.random.key(7)), first, rtol=0, atol=0)
    assert not torch.equal(losses(sbfunc.random.key(8)), first)  # the key drives dropout


def test_the_same_state_gives_the_same_step(built):
    _, _, step, state = built
    a, ma = step(state, _batch(0))
    b, mb = step(state, _batch(0))
    _assert_close(a, b)
    torch.testing.assert_close(ma.loss, mb.loss, rtol=0, atol=0)


def test_sb_prunes_the_string_field_with_the_rows(built):
    _, _, step, state = built
    sb = step.algorithms[0]  # bound by the step: it scores with the step's loss
    batch = _batch(3)
    view = sbfunc.Context(sbfunc.random.key(1), state.params, state.buffers, batch=batch)
    kept = sb.apply(sbfunc.Event.AFTER_DATALOADER, view).batch
    assert len(kept["text"]) == kept["input_ids"].shape[0] == kept["labels"].shape[0] == N // 2
    assert kept["text"] == [TEXTS[int(r) - 1] for r in kept["input_ids"][:, 0]]
    for _ in range(3):
        state, metrics = step(state, _batch(_))
        assert metrics.samples_backpropagated == N // 2
        assert torch.isfinite(metrics.loss)
    assert state.time.samples_backpropagated == 3 * N // 2


def test_compiled_step_equals_eager_with_a_bounded_number_of_graphs():
    # New strings every batch: the compiled step traces the text field as row indices
    # (sbfunc.batch.strings_as_row_indices), so no guard on the strings recompiles it.
    torch._dynamo.reset()
    counters.clear()
    _, _, step, state = _build()
    # aot_eager: dynamo's graphs and AOTAutograd's, without inductor's code generation (the
    # graph count and the equality are what this checks; tests/step/test_compile.py runs inductor)
    compiled = torch.compile(step, backend="aot_eager")
    graphs = []
    for i in range(3):
        batch = _batch(i, texts=[f"batch {i} row {j}" for j in range(N)])
        eager, em = step(state, batch)
        state, cm = compiled(state, batch)
        _assert_close(eager, state)
        torch.testing.assert_close(cm.loss, em.loss, rtol=1e-5, atol=1e-6)
        assert em.samples_backpropagated == cm.samples_backpropagated == N // 2
        assert eager.time == state.time
        assert batch["text"][0] == f"batch {i} row 0"  # the caller's batch is untouched
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[0] == graphs[-1], graphs  # later steps reuse the first step's graphs
    assert graphs[-1] <= 2, graphs  # the step's core, at most one break
