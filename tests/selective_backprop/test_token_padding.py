"""Rows without a real token never compete in a token selection (issue 40, items 2 and 7).

A fully padded row, a prompt-only row (every label -100) or a row labelled only at position 0
(no next-token target) is replaced before the forward by a weightless copy of a usable row. In
1.1 the copy's tokens still counted in the batch's total and took kept slots. Now the kept
count is ``floor(keep x real tokens)`` whatever the padding, the update is the one on the
usable rows alone, and the stand-ins never enter ``samples_backpropagated`` or
``tokens_backpropagated``.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc.selective_backprop import TokenSelection
from tests.helpers import lm_loss, tiny_lm

L, V = 9, 257
KINDS = ("full", "padded", "empty", "prompt_only", "first_only")


def _row(kind: str, ids: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    mask, labels = torch.ones(L, dtype=torch.long), ids.clone()
    if kind == "padded":
        mask[length:], labels[length:] = 0, -100
    elif kind == "empty":
        mask[:], labels[:] = 0, -100
    elif kind == "prompt_only":
        labels[:] = -100
    elif kind == "first_only":
        labels[1:] = -100
    return mask, labels


@st.composite
def batches(draw):
    """A batch of right-padded rows, some with no real next-token target, one usable at
    least; and which rows are usable."""
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=2, max_size=6))
    kinds[draw(st.integers(0, len(kinds) - 1))] = "full"
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    ids = torch.randint(0, V, (len(kinds), L), generator=g)
    rows = [_row(k, ids[i], draw(st.integers(2, L - 1))) for i, k in enumerate(kinds)]
    batch = {
        "input_ids": ids,
        "attention_mask": torch.stack([m for m, _ in rows]),
        "labels": torch.stack([y for _, y in rows]),
    }
    usable = torch.tensor([k in ("full", "padded") for k in kinds])
    return batch, usable


def _real_targets(batch: dict[str, torch.Tensor]) -> int:
    return int((batch["labels"][:, 1:] != -100).sum())


def _step(keep: float, score: str = "loss", **options):
    model = tiny_lm(L)
    sel = TokenSelection(keep, score=score)
    step = sbfunc.make_train_step(lm_loss(model), sbfunc.optim.sgd(0.5), [sel], **options)
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(1))
    return step, state


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(case=batches(), keep=st.floats(0.05, 1.0), score=st.sampled_from(["loss", "uniform"]))
def test_the_kept_count_is_floor_of_keep_times_the_real_tokens_whatever_the_padding(
    case, keep, score
):
    batch, usable = case
    step, state = _step(keep, score)
    _, metrics = step(state, batch)
    real = _real_targets(batch)
    assert int(metrics.tokens_backpropagated) == max(1, int(real * keep))
    assert metrics.samples_backpropagated == int(usable.sum())
    assert int(metrics.rows_nonfinite) == int((~usable).sum())


@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(case=batches(), keep=st.floats(0.05, 1.0))
def test_the_update_is_the_one_on_the_usable_rows_alone(case, keep):
    batch, usable = case
    step, state = _step(keep)
    with_stand_ins, metrics = step(state, batch)
    alone, reference = step(state, {k: v[usable] for k, v in batch.items()})
    assert int(metrics.tokens_backpropagated) == int(reference.tokens_backpropagated)
    torch.testing.assert_close(metrics.loss, reference.loss, rtol=1e-5, atol=1e-6)
    for k in alone.params:
        torch.testing.assert_close(with_stand_ins.params[k], alone.params[k], rtol=1e-4, atol=1e-6)


def test_the_issue_case_one_padded_row_and_keep_half():
    # issue 40: one fully padded row, keep=0.5 -> Rho-1 keeps 10 of 21 real tokens
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, V, (4, L), generator=g)
    rows = [_row("full", ids[0], 0), _row("padded", ids[1], 5), _row("empty", ids[2], 0),
            _row("padded", ids[3], 6)]  # fmt: skip
    batch = {"input_ids": ids, "attention_mask": torch.stack([m for m, _ in rows]),
             "labels": torch.stack([y for _, y in rows])}  # fmt: skip
    assert _real_targets(batch) == 8 + 4 + 5
    step, state = _step(0.5)
    _, metrics = step(state, batch)
    assert int(metrics.tokens_backpropagated) == 8 and metrics.samples_backpropagated == 3


def test_a_step_with_no_usable_row_trains_and_counts_nothing():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, V, (3, L), generator=g)
    rows = [_row(k, ids[i], 0) for i, k in enumerate(("empty", "prompt_only", "first_only"))]
    batch = {"input_ids": ids, "attention_mask": torch.stack([m for m, _ in rows]),
             "labels": torch.stack([y for _, y in rows])}  # fmt: skip
    step, state = _step(0.5)
    new, metrics = step(state, batch)
    assert bool(metrics.skipped) and metrics.samples_backpropagated == 0
    assert new.time.samples_backpropagated == 0
    assert int(metrics.tokens_backpropagated) == 0
    assert all(torch.equal(new.params[k], state.params[k]) for k in state.params)


def test_a_plain_token_step_reports_the_tokens_it_averaged():
    case = {"input_ids": torch.zeros(2, L, dtype=torch.long), "labels": torch.zeros(2, L)}
    case["labels"] = case["input_ids"].clone()
    case["labels"][1, 4:] = -100
    case["attention_mask"] = torch.ones(2, L, dtype=torch.long)
    step, state = _step(1.0)
    _, metrics = step(state, case)
    assert int(metrics.tokens_backpropagated) == (L - 1) + 3


@pytest.mark.slow
def test_compiled_steps_leave_stand_ins_out_of_the_selection_too():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, V, (4, L), generator=g)
    rows = [_row(k, ids[i], 5) for i, k in enumerate(("full", "empty", "padded", "first_only"))]
    batch = {"input_ids": ids, "attention_mask": torch.stack([m for m, _ in rows]),
             "labels": torch.stack([y for _, y in rows])}  # fmt: skip
    step, state = _step(0.5)
    compiled, _ = _step(0.5)
    compiled.compile(backend="aot_eager", fullgraph=True)
    a, ma = step(state, batch)
    b, mb = compiled(state, batch)
    assert int(ma.tokens_backpropagated) == int(mb.tokens_backpropagated) == (8 + 4) // 2
    assert ma.samples_backpropagated == mb.samples_backpropagated == 2  # on the CPU: exact
    for k in a.params:
        torch.testing.assert_close(a.params[k], b.params[k], rtol=1e-5, atol=1e-6)
