"""What a step kept is visible: ``StepMetrics.kept`` holds the selected rows' indices into the
batch the step was given, and their weights, without a host read (issue 35, item 8)."""

import pytest
import torch
import torch.nn.functional as F

import sbfunc
from tests.helpers import split
from tests.meta import META, all_meta, to_meta

N, D, C = 12, 5, 3


def _step(policy=None, *, compile=False, microbatches=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(D, 8), torch.nn.ReLU(), torch.nn.Linear(8, C))
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    algorithms = []
    if policy is not None:
        algorithms = [sbfunc.SelectiveBackprop(start=0.0, end=1.0, interrupt=0, policy=policy)]
    step = sbfunc.make_train_step(
        loss_fn, sbfunc.optim.sgd(0.1), algorithms, microbatching=split(chunks=microbatches)
    )
    if compile:
        step.compile(backend="eager", fullgraph=True)
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))
    return loss_fn, step, state


def _batch():
    g = torch.Generator().manual_seed(3)
    return torch.randn(N, D, generator=g), torch.randint(0, C, (N,), generator=g)


def test_a_step_without_selection_keeps_none():
    _, step, state = _step()
    assert step(state, _batch())[1].kept is None


@pytest.mark.parametrize("microbatches", [None, 2])
def test_top_k_keeps_the_highest_losses_and_says_which(microbatches):
    loss_fn, step, state = _step(sbfunc.policies.top_k(0.25), microbatches=microbatches)
    batch = _batch()
    _, metrics = step(state, batch)
    with torch.no_grad():
        losses = loss_fn.with_mode("eval")(state.params, state.buffers, batch)
    expected = torch.sort(torch.topk(losses, 3).indices).values
    assert torch.equal(metrics.kept.indices, expected)
    assert metrics.kept.weights is None and metrics.samples_backpropagated == 3


def test_weighted_selections_report_their_weights():
    policy = sbfunc.policies.grad_norm_importance(0.5, fixed_size=True)
    _, step, state = _step(policy)
    _, metrics = step(state, _batch())
    kept = metrics.kept
    assert kept.weights is not None and kept.weights.shape == kept.indices.shape
    assert bool((kept.indices.diff() > 0).all())  # sorted, unique


def test_compiled_steps_report_the_same_rows():
    batch = _batch()
    eager = _step(sbfunc.policies.top_k(0.5))
    compiled = _step(sbfunc.policies.top_k(0.5), compile=True)
    a, b = eager[1](eager[2], batch)[1].kept, compiled[1](compiled[2], batch)[1].kept
    assert torch.equal(a.indices, b.indices)


def test_the_kept_rows_stay_on_the_device():
    _, step, state = _step(sbfunc.policies.top_k(0.5))
    state = to_meta(state)
    x, y = _batch()
    _, metrics = step(state, (x.to(META), y.to(META)))
    assert all_meta(metrics.kept)
