"""Token-aware losses (issue 36, item 1): a row's loss is the mean over its real tokens, and the
step's objective is Hugging Face's, the mean over every real token of the batch, exactly where
``F.cross_entropy(..., ignore_index=-100)`` defines it: unsplit, microbatched and after a
selection of rows; ``objective="rows"`` is the mean of the rows' means."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from tests.helpers import split

V, D = 5, 4


class TokenModel(torch.nn.Module):
    """``input_ids [N, L] -> logits [N, L, V]`` (class-last), rows independent."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(V, D, dtype=torch.float64)
        self.out = torch.nn.Linear(D, V, dtype=torch.float64)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.embed(input_ids)))


@st.composite
def token_batches(draw, min_rows=2):
    n = draw(st.integers(min_rows, 6))
    length = draw(st.integers(2, 7))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (n, length), generator=g)
    labels = torch.randint(0, V, (n, length), generator=g)
    labels[torch.rand(n, length, generator=g) < draw(st.floats(0.0, 0.7))] = -100
    labels[0, -1] = 1  # the batch has a real token (also after the causal shift)
    return {"input_ids": ids, "labels": labels}


def _hf_loss(model, params, batch, criterion, rows=None):
    """Hugging Face's loss: F.cross_entropy(..., ignore_index=-100) over every real token."""
    logits = torch.func.functional_call(model, params, (batch["input_ids"],))
    labels = batch["labels"]
    if criterion is sbfunc.module.next_token_cross_entropy:
        logits, labels = logits[:, :-1], labels[:, 1:]
    if rows is not None:
        logits, labels = logits[rows], labels[rows]
    return F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=-100)


def _step(criterion, algorithms=(), **options):
    model = TokenModel()
    loss_fn = sbfunc.per_sample_loss(model, criterion, input="input_ids", target="labels")
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(1.0), algorithms, **options)
    params, buffers = sbfunc.split_module(model, clone=True)
    return model, step, step.init(params, buffers, key=sbfunc.random.key(0))


def _expected_update(model, params, batch, criterion, rows=None):
    p = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    loss = _hf_loss(model, p, batch, criterion, rows)
    grads = torch.autograd.grad(loss, list(p.values()))
    return loss.detach(), {k: v - g for (k, v), g in zip(params.items(), grads, strict=True)}


CRITERIA = [sbfunc.module.token_cross_entropy, sbfunc.module.next_token_cross_entropy]


@pytest.mark.parametrize("criterion", CRITERIA, ids=repr)
@settings(max_examples=25, deadline=None)
@given(batch=token_batches())
def test_the_objective_is_hugging_faces_token_mean(criterion, batch):
    model, step, state = _step(criterion)
    new, metrics = step(state, batch)
    loss, params = _expected_update(model, state.params, batch, criterion)
    torch.testing.assert_close(metrics.loss, loss, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(new.params, params, rtol=1e-12, atol=1e-12)
    assert not bool(metrics.skipped)


@pytest.mark.parametrize("criterion", CRITERIA, ids=repr)
@settings(max_examples=15, deadline=None)
@given(batch=token_batches(min_rows=3), size=st.integers(1, 2))
def test_microbatches_combine_by_tokens_not_rows(criterion, batch, size):
    model, step, state = _step(criterion, microbatching=split(size=size))
    new, metrics = step(state, batch)
    loss, params = _expected_update(model, state.params, batch, criterion)
    torch.testing.assert_close(metrics.loss, loss, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(new.params, params, rtol=1e-10, atol=1e-12)


@settings(max_examples=15, deadline=None)
@given(batch=token_batches(min_rows=4))
def test_after_a_selection_the_objective_is_the_mean_over_the_kept_rows_tokens(batch):
    sb = sbfunc.SelectiveBackprop(
        start=0.0, end=1.0, interrupt=0, policy=sbfunc.policies.top_k(0.5)
    )
    criterion = sbfunc.module.token_cross_entropy
    model, step, state = _step(criterion, [sb])
    new, metrics = step(state, batch)
    kept = metrics.kept.indices
    real = (batch["labels"][kept] != -100).any()
    if not bool(real):
        return  # the kept rows have no real token: the step skips (tested elsewhere)
    loss, params = _expected_update(model, state.params, batch, criterion, rows=kept)
    torch.testing.assert_close(metrics.loss, loss, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(new.params, params, rtol=1e-12, atol=1e-12)


def test_a_rows_objective_averages_the_rows_means():
    batch = {
        "input_ids": torch.tensor([[1, 2, 3, 4, 0, 1], [2, 2, 1, 0, 3, 3]]),
        "labels": torch.tensor([[1, 2, -100, -100, -100, -100], [0, 1, 2, 3, 4, 0]]),
    }
    criterion = sbfunc.module.token_cross_entropy
    model, step, state = _step(criterion, objective="rows")
    _, metrics = step(state, batch)
    rows = [_hf_loss(model, state.params, batch, criterion, rows=[i]) for i in range(2)]
    torch.testing.assert_close(metrics.loss, (rows[0] + rows[1]) / 2, rtol=1e-12, atol=0)


def test_a_rows_loss_is_the_mean_over_its_real_tokens_not_over_its_length():
    """The issue's numbers: a row with 2 real tokens of 6 had 0.471 (ignored tokens averaged in
    as zeros) where the mean over its real tokens is 1.413."""
    model = TokenModel()
    batch = {"input_ids": torch.zeros(1, 6, dtype=torch.long),
             "labels": torch.tensor([[1, 2, -100, -100, -100, -100]])}  # fmt: skip
    for criterion in (sbfunc.module.token_cross_entropy, F.cross_entropy):
        module = (
            torch.nn.Sequential(model, _ClassesSecond()) if criterion is F.cross_entropy else model
        )
        loss_fn = sbfunc.per_sample_loss(module, criterion, input="input_ids", target="labels")
        params, buffers = sbfunc.split_module(loss_fn.module)
        got = loss_fn(params, buffers, batch)
        expected = _hf_loss(model, dict(model.named_parameters()), batch, criterion)
        torch.testing.assert_close(got, expected.reshape(1), rtol=1e-12, atol=0)


class _ClassesSecond(torch.nn.Module):
    """``[N, L, V] -> [N, V, L]``: torch's layout for F.cross_entropy's class dimension."""

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.transpose(1, 2)


def test_the_objective_argument_is_checked():
    loss_fn = sbfunc.per_sample_loss(TokenModel(), sbfunc.module.token_cross_entropy)
    with pytest.raises(ValueError, match="objective must be one of 'rows', 'tokens'"):
        sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1), objective="mean")
