"""Gradient accumulation by items (issue 40, item 5): ``multi_steps(..., by_items=True)``
averages over every item (real token, row) of the ``k`` batches, as Hugging Face's
``num_items_in_batch`` does, where the default averages the ``k`` batch means."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc import optim
from sbfunc.selective_backprop import TokenSelection
from tests.helpers import lm_loss, tiny_lm


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(
    k=st.integers(1, 4),
    items=st.lists(st.integers(0, 50), min_size=4, max_size=4),
    seed=st.integers(0, 99),
)
def test_the_inner_update_sees_the_mean_over_every_item(k, items, seed):
    g = torch.Generator().manual_seed(seed)
    grads = [torch.randn(3, generator=g, dtype=torch.float64) for _ in range(k)]
    opt = optim.multi_steps(optim.sgd(1.0), k, by_items=True)
    state = opt.init({"w": torch.zeros(3, dtype=torch.float64)})
    for grad, n in zip(grads, items, strict=False):
        updates, state = opt.update({"w": grad}, state, items=n)
    total = sum(items[:k])
    expected = -sum(n * grad for grad, n in zip(grads, items, strict=False)) / max(total, 1)
    torch.testing.assert_close(updates["w"], expected)
    assert int(state.items) == 0 and int(state.steps.gradient_step) == 1


def test_a_skipped_micro_step_adds_no_items():
    opt = optim.multi_steps(
        optim.sgd(1.0), 2, by_items=True, should_skip_update_fn=optim.skip_not_finite
    )
    state = opt.init({"w": torch.zeros(1)})
    _, state = opt.update({"w": torch.tensor([1.0])}, state, items=3)
    _, state = opt.update({"w": torch.tensor([float("nan")])}, state, items=100)
    assert int(state.items) == 3
    updates, state = opt.update({"w": torch.tensor([5.0])}, state, items=1)
    torch.testing.assert_close(updates["w"], torch.tensor([-2.0]))


def test_items_are_checked():
    with pytest.raises(ValueError, match="use_mean=True"):
        optim.multi_steps(optim.sgd(1.0), 2, by_items=True, use_mean=False)
    opt = optim.multi_steps(optim.sgd(1.0), 2, by_items=True)
    state = opt.init({"w": torch.zeros(1)})
    with pytest.raises(ValueError, match="needs items="):
        opt.update({"w": torch.ones(1)}, state)
    with pytest.raises(TypeError, match="0-d integer tensor"):
        opt.update({"w": torch.ones(1)}, state, items=torch.tensor(2.0))
    with pytest.raises(ValueError, match=">= 0"):
        opt.update({"w": torch.ones(1)}, state, items=-1)
    plain = optim.multi_steps(optim.sgd(1.0), 2)
    with pytest.raises(ValueError, match="by_items=True"):
        plain.update({"w": torch.ones(1)}, plain.init({"w": torch.zeros(1)}), items=2)


L = 9


def _batches() -> tuple[dict, dict]:
    """Two batches of one length: 28 real next-token targets and 6 (the issue's counts)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 257, (8, L), generator=g)
    lengths = torch.tensor([L, L, L, 5, 2, 3, 3, 2])
    mask = (torch.arange(L) < lengths[:, None]).long()
    labels = ids.masked_fill(mask == 0, -100)
    rows = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    first = {k: v[:4] for k, v in rows.items()}
    second = {k: v[4:] for k, v in rows.items()}
    assert int((first["labels"][:, 1:] != -100).sum()) == 28
    assert int((second["labels"][:, 1:] != -100).sum()) == 6
    return first, second


def _train(optimizer, batches, algorithms=()):
    model = tiny_lm(L)
    step = sbfunc.make_train_step(lm_loss(model), optimizer, list(algorithms))
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(1))
    for batch in batches:
        state, metrics = step(state, batch)
    return state, metrics


def test_accumulating_by_tokens_is_one_step_on_the_batches_together():
    first, second = _batches()
    together = {k: torch.cat([first[k], second[k]]) for k in first}
    one, _ = _train(optim.sgd(0.5), [together])
    by_tokens, _ = _train(optim.multi_steps(optim.sgd(0.5), 2, by_items=True), [first, second])
    by_batches, _ = _train(optim.multi_steps(optim.sgd(0.5), 2), [first, second])
    for k in one.params:
        torch.testing.assert_close(by_tokens.params[k], one.params[k], rtol=1e-5, atol=1e-6)
    assert any(
        not torch.allclose(by_batches.params[k], one.params[k], rtol=1e-3, atol=1e-5)
        for k in one.params
    )


def test_with_token_selection_the_kept_tokens_weigh():
    first, second = _batches()
    selection = [TokenSelection(0.5, score="loss")]
    state, metrics = _train(
        optim.multi_steps(optim.sgd(0.5), 2, by_items=True), [first, second], selection
    )
    assert int(metrics.tokens_backpropagated) == 3 and int(state.opt_state.items) == 0
