"""A row with no usable token costs one row, never an update (issue 36, item 2).

An empty text after padding (an all-zero attention mask), a row whose labels are all -100, or a
NaN in a float attention mask is removed from the computation before the forward; the rest of
the batch trains, the row is counted once in ``rows_nonfinite``, and ``fit`` warns. Eager and
compiled, with and without selection, in float32 and ``amp_bf16``.
"""

import warnings

import pytest
import torch
import torch.nn.functional as F

import sbfunc

VOCAB, WIDTH, CLASSES, LENGTH, N = 11, 16, 3, 6, 8


class Encoder(torch.nn.Module):
    """A small Hugging Face-style classifier: ``(input_ids, attention_mask) -> logits``,
    ``nn.TransformerEncoder`` with the padding mask, masked mean pooling (an empty row divides
    by zero: NaN)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        layer = torch.nn.TransformerEncoderLayer(WIDTH, 2, 32, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = torch.nn.Linear(WIDTH, CLASSES)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.embed(input_ids), src_key_padding_mask=attention_mask == 0)
        m = attention_mask.unsqueeze(-1).to(h.dtype)
        return self.head((h * m).sum(1) / m.sum(1))


def _batch(seed: int, empty: int | None = 3) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (N, LENGTH), generator=g)
    mask = torch.ones(N, LENGTH, dtype=torch.long)
    mask[:, 4:] = 0  # some padding everywhere
    if empty is not None:
        mask[empty] = 0  # an empty text
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.randint(0, CLASSES, (N,))}


def _step(algorithms=(), *, precision="fp32", compile=False, optimizer=None):
    model = Encoder()
    loss_fn = sbfunc.per_sample_loss(
        model, F.cross_entropy, input=("input_ids", "attention_mask"), target="labels"
    )
    optimizer = sbfunc.optim.adam(1e-2) if optimizer is None else optimizer
    step = sbfunc.make_train_step(loss_fn, optimizer, algorithms, precision=precision)
    if compile:
        step.compile(backend="eager")
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))
    return step, state


def _selective():
    return [sbfunc.SelectiveBackprop(start=0.0, end=1.0, interrupt=0, keep=0.5)]


def _without(batch: dict, row: int) -> dict:
    keep = torch.tensor([i for i in range(N) if i != row])
    return {k: v[keep] for k, v in batch.items()}


def test_the_update_is_the_update_of_the_other_rows():
    step, state = _step(optimizer=sbfunc.optim.sgd(0.1))  # (Adam would magnify rounding)
    batch = _batch(0)
    new, metrics = step(state, batch)
    other = step(state, _without(batch, 3))[0]
    assert not bool(metrics.skipped) and int(metrics.rows_nonfinite) == 1
    torch.testing.assert_close(new.params, other.params, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(metrics.loss, step(state, _without(batch, 3))[1].loss)


@pytest.mark.parametrize("selection", [False, True], ids=["plain", "selective"])
@pytest.mark.parametrize("precision", ["fp32", "amp_bf16"])
def test_fit_with_an_empty_text_in_every_batch_skips_no_update(selection, precision):
    step, state = _step(_selective() if selection else (), precision=precision)
    data = [_batch(seed) for seed in range(5)]
    with pytest.warns(sbfunc.step.NonFiniteRowsWarning, match="the other rows of its batch"):
        final = sbfunc.fit(step, state, data, epochs=2, progress=False).state
    assert int(final.time.updates_skipped) == 0
    assert int(final.time.rows_nonfinite) == 10  # one row per step, counted once
    moved = [not torch.equal(final.params[k], state.params[k]) for k in state.params]
    assert all(moved)


@pytest.mark.parametrize("selection", [False, True], ids=["plain", "selective"])
def test_compiled_steps_leave_the_empty_text_out_too(selection):
    batch = _batch(1)
    eager_step, state = _step(_selective() if selection else ())
    compiled_step, _ = _step(_selective() if selection else (), compile=True)
    eager, _ = eager_step(state, batch)
    compiled, m_compiled = compiled_step(state, batch)
    assert not bool(m_compiled.skipped) and int(m_compiled.rows_nonfinite) == 1
    torch.testing.assert_close(compiled.params, eager.params, rtol=1e-5, atol=1e-6)


def test_a_selection_never_keeps_the_empty_text():
    step, state = _step(_selective())
    _, metrics = step(state, _batch(2, empty=5))
    assert 5 not in metrics.kept.indices.tolist()
    assert int(metrics.rows_nonfinite) == 1  # left out by the selection, counted once


def test_a_nan_in_a_float_attention_mask_costs_one_row():
    step, state = _step()
    batch = _batch(4, empty=None)
    batch["attention_mask"] = batch["attention_mask"].float()
    batch["attention_mask"][2, 0] = torch.nan
    _, metrics = step(state, batch)
    assert not bool(metrics.skipped) and int(metrics.rows_nonfinite) == 1


def test_a_row_whose_labels_are_all_ignored_costs_one_row():
    model = sbfunc.models.CausalLM(vocab_size=VOCAB, d_model=16, num_heads=2, num_layers=1)
    loss_fn = sbfunc.per_sample_loss(
        model, sbfunc.module.next_token_cross_entropy, input=("input_ids", "attention_mask"),
        target="labels",
    )  # fmt: skip
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.adam(1e-2))
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))
    batch = _batch(5, empty=None)
    batch["labels"] = batch["input_ids"].clone()
    batch["labels"][1] = -100
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, metrics = step(state, batch)
    assert not bool(metrics.skipped) and int(metrics.rows_nonfinite) == 1


def test_with_every_row_unusable_the_update_is_skipped_and_warned():
    step, state = _step()
    batch = _batch(6, empty=None)
    batch["attention_mask"][:] = 0
    with pytest.warns(sbfunc.step.SkippedUpdatesWarning, match="were skipped"):
        final = sbfunc.fit(step, state, [batch], epochs=2, progress=False).state
    assert int(final.time.updates_skipped) == 2
