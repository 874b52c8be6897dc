"""Sequence-level Selective Backprop on a causal LM (issue 36, item 5): dict batches,
padding-aware scores (each row's mean over its real tokens), Composer's SeqLengthWarmup and
ALiBi in the same step, and RHO-LOSS with a reference's per-row losses by id."""

import pytest
import torch

import sbfunc
from sbfunc.selective_backprop import SelectiveBackprop, reference_losses

L = 32


def _corpus():
    return sbfunc.datasets.stdlib_corpus(seq_len=L, max_bytes=12_000)


def _loss(model):
    return sbfunc.per_sample_loss(
        model, sbfunc.module.next_token_cross_entropy, input=("input_ids", "attention_mask"),
        target="labels",
    )  # fmt: skip


def _batches(rows, epoch):
    return list(sbfunc.datasets.dict_batches(rows, 8, key=sbfunc.random.key(epoch)))[:4]


def test_scores_are_each_rows_mean_over_its_real_tokens():
    rows = {k: v[:6] for k, v in _corpus().rows.items()}
    rows["labels"] = rows["labels"].clone()
    rows["labels"][0, 10:] = -100  # a short row: its padding must not dilute its loss
    rows["attention_mask"] = rows["attention_mask"].clone()
    rows["attention_mask"][0, 10:] = 0
    model = sbfunc.models.CausalLM(d_model=16, num_heads=2, num_layers=1, max_len=L)
    loss_fn = _loss(model)
    params, buffers = sbfunc.split_module(model)
    scores = sbfunc.score.score_losses(loss_fn, params, buffers, rows)
    logits = model(rows["input_ids"], rows["attention_mask"]).detach()
    expected = torch.nn.functional.cross_entropy(logits[0, :9], rows["labels"][0, 1:10])
    torch.testing.assert_close(scores[0], expected)


def test_selective_backprop_with_seq_length_warmup_and_alibi_in_one_step():
    corpus = _corpus()
    alibi = sbfunc.algorithms.Alibi(max_sequence_length=L, train_sequence_length_scaling=1.0)
    model = alibi(sbfunc.models.CausalLM(d_model=16, num_heads=2, num_layers=1, max_len=L))
    warmup = sbfunc.algorithms.SeqLengthWarmup(
        duration=0.5, min_seq_length=8, max_seq_length=L, step_size=8
    )
    sb = SelectiveBackprop(start=0.0, end=1.0, interrupt=0, keep=0.5)
    step = sbfunc.make_train_step(_loss(model), sbfunc.optim.adam(3e-3), [alibi, warmup, sb])
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))
    result = sbfunc.fit(
        step, state, lambda epoch: _batches(corpus.rows, epoch), epochs=2, progress=False
    )
    final = result.state
    assert int(final.time.updates_skipped) == 0
    assert [m.samples_backpropagated for m in result.history] == [4] * 8
    assert all(torch.isfinite(m.loss) for m in result.history)


def test_rho_loss_with_a_reference_s_row_losses_by_id():
    corpus = _corpus()
    rows = {k: v for k, v in corpus.rows.items() if k != "kind"}
    assert torch.equal(rows["ids"], torch.arange(rows["ids"].shape[0]))  # row i has id i
    ref = sbfunc.models.CausalLM(d_model=16, num_heads=2, num_layers=1, max_len=L)
    irreducible = reference_losses(_loss(ref), *sbfunc.split_module(ref), rows, per="row")
    model = sbfunc.models.CausalLM(d_model=16, num_heads=2, num_layers=1, max_len=L)
    sb = SelectiveBackprop(
        start=0.0, end=1.0, interrupt=0, ids="ids",
        policy=sbfunc.policies.rho_loss(0.5, irreducible),
    )  # fmt: skip
    step = sbfunc.make_train_step(_loss(model), sbfunc.optim.adam(3e-3), [sb])
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))
    for batch in _batches(rows, 0):
        state, metrics = step(state, batch)
        assert metrics.samples_backpropagated == 4 and bool(torch.isfinite(metrics.loss))


def test_a_row_table_is_indexed_by_the_rows_ids():
    # a split keeps the corpus's ids: row order and id differ, and the table follows the ids
    corpus = _corpus()
    split = sbfunc.datasets.split_corpus(corpus, heldout=0.3, key=sbfunc.random.key(0))
    rows = {k: v for k, v in split.train.items() if k != "kind"}
    assert not torch.equal(rows["ids"], torch.arange(rows["ids"].shape[0]))
    ref = sbfunc.models.CausalLM(d_model=16, num_heads=2, num_layers=1, max_len=L)
    loss, (params, buffers) = _loss(ref), sbfunc.split_module(ref)
    by_id = reference_losses(loss, params, buffers, rows, per="row")
    in_order = reference_losses(loss, params, buffers, rows, per="row", ids=None)
    assert by_id.shape == (int(rows["ids"].max()) + 1,)
    assert torch.equal(by_id[rows["ids"]], in_order)
    assert int(torch.isfinite(by_id).sum()) == rows["ids"].shape[0]  # NaN at the other ids
    model = sbfunc.models.CausalLM(d_model=16, num_heads=2, num_layers=1, max_len=L)
    sb = SelectiveBackprop(
        start=0.0, end=1.0, interrupt=0, ids="ids", policy=sbfunc.policies.rho_loss(0.5, by_id)
    )
    step = sbfunc.make_train_step(_loss(model), sbfunc.optim.adam(3e-3), [sb])
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))
    state, metrics = step(state, _batches(rows, 0)[0])
    assert bool(torch.isfinite(metrics.loss))


@pytest.mark.parametrize(
    ("ids", "message"),
    [("row_id", "not a field"), ("ids", "distinct")],
)
def test_a_row_table_refuses_ids_it_cannot_index_by(ids, message):
    rows = {k: v for k, v in _corpus().rows.items() if k != "kind"}
    rows["ids"] = torch.zeros_like(rows["ids"])
    ref = sbfunc.models.CausalLM(d_model=16, num_heads=2, num_layers=1, max_len=L)
    with pytest.raises(ValueError, match=message):
        reference_losses(_loss(ref), *sbfunc.split_module(ref), rows, per="row", ids=ids)
