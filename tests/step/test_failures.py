"""Failure behaviour of the step (docs/how-to/failures.md): an empty batch and a non-finite
loss or gradient make no update on every path, and are counted as skipped."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import sbfunc
from sbfunc import random as sbrandom
from tests.policies.test_registry import POLICIES

SETTINGS = settings(max_examples=12, derandomize=True, database=None, deadline=None)

torch.manual_seed(0)
MODEL = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
PARAMS, BUFFERS = sbfunc.split_module(MODEL, clone=True)
TRAIN_LOSS = sbfunc.per_sample_loss(MODEL, F.cross_entropy, mode="train")
SCORE_LOSS = sbfunc.per_sample_loss(MODEL, F.cross_entropy)


def _sb(name: str) -> sbfunc.SelectiveBackprop:
    if name in {"rank_power", "top_k", "random_subset"}:
        policy = getattr(sbfunc.policies, name)(0.5)
        return sbfunc.SelectiveBackprop(
            0.0, 1.0, interrupt=0, policy=policy, scoring=sbfunc.score.Scoring(loss_fn=SCORE_LOSS)
        )
    return sbfunc.SelectiveBackprop(
        0.0,
        1.0,
        interrupt=0,
        policy=POLICIES[name](),
        ids=2,
        scoring=sbfunc.score.Scoring(loss_fn=SCORE_LOSS),
    )


PATHS = {
    "plain": lambda: [],
    "cutout": lambda: [sbfunc.algorithms.CutOut(num_holes=1, length=0.5)],
    "mixup": lambda: [sbfunc.algorithms.MixUp(alpha=0.2, num_classes=3)],
    "label_smoothing": lambda: [sbfunc.algorithms.LabelSmoothing(0.1, num_classes=3)],
    **{f"sb_{n}": (lambda n=n: [_sb(n)]) for n in ["rank_power", "top_k", "random_subset"]},
    **{f"sb_policy_{n}": (lambda n=n: [_sb(n)]) for n in sorted(POLICIES)},
}


def _batch(n: int, seed: int = 0, image: bool = False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = (x[:, 0] > 0).long()
    return x, y, torch.arange(n) % 64


def _run(algorithms, batch, **kwargs):
    step = sbfunc.make_train_step(TRAIN_LOSS, sbfunc.optim.adam(1e-2), algorithms, **kwargs)
    state = step.init(PARAMS, BUFFERS, key=sbrandom.key(0), total_steps=64)
    state = state.replace(time=state.time._replace(elapsed=0.5))
    warm, _ = step(state, _batch(8, seed=1))  # a non-trivial optimizer state
    return warm, *step(warm, batch)


def _unchanged(before, after) -> bool:
    trees = [(before.params, after.params), (before.buffers, after.buffers)]
    trees.append((before.opt_state, after.opt_state))
    return all(
        torch.equal(a, b)
        for x, y in trees
        for a, b in zip(
            torch.utils._pytree.tree_leaves(x), torch.utils._pytree.tree_leaves(y), strict=True
        )
    )


def _supported(name: str) -> bool:
    return not name.startswith(("cutout",))  # CutOut needs an image batch: tested below


@pytest.mark.parametrize("name", [n for n in sorted(PATHS) if _supported(n)])
def test_an_empty_batch_makes_no_update_and_is_counted_on_every_path(name):
    before, after, metrics = _run(PATHS[name](), _batch(0))
    assert bool(metrics.skipped)
    assert int(after.time.updates_skipped) == int(before.time.updates_skipped) + 1
    assert after.time.step == before.time.step + 1
    assert _unchanged(before, after)


def test_an_empty_image_batch_through_cutout_makes_no_update():
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    params, buffers = sbfunc.split_module(model, clone=True)
    loss = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    step = sbfunc.make_train_step(
        loss, sbfunc.optim.sgd(0.1), [sbfunc.algorithms.CutOut(length=0.5)]
    )
    state = step.init(params, buffers, key=sbrandom.key(0), total_steps=64)
    after, metrics = step(state, (torch.zeros(0, 3, 2, 2), torch.zeros(0, dtype=torch.int64)))
    assert bool(metrics.skipped) and int(after.time.updates_skipped) == 1
    assert all(torch.equal(after.params[k], state.params[k]) for k in state.params)


@pytest.mark.parametrize("name", ["plain", "sb_rank_power", "sb_top_k", "sb_policy_jiang"])
@SETTINGS
@given(
    rows=st.lists(st.integers(0, 7), min_size=1, max_size=3),
    value=st.sampled_from([float("nan"), float("inf"), -float("inf")]),
)
def test_a_non_finite_row_never_reaches_the_parameters(name, rows, value):
    x, y, ids = _batch(8)
    x = x.clone()
    x[rows, 0] = value
    before, after, metrics = _run(PATHS[name](), (x, y, ids))
    finite = all(torch.isfinite(p).all() for p in after.params.values())
    assert finite  # skipped, or the poisoned rows were not selected
    if bool(metrics.skipped):
        assert _unchanged(before, after)
        assert int(after.time.updates_skipped) == int(before.time.updates_skipped) + 1
    else:
        assert torch.isfinite(metrics.loss)


GRADIENT_POISONS = {  # a zero loss term whose gradient is not finite
    "inf": lambda w: torch.sqrt(w - w.detach()).sum(),  # d sqrt(x) at 0: +inf
    "nan": lambda w: torch.sqrt(w * 0.0).sum(),  # +inf * 0: NaN
}


@pytest.mark.parametrize("poison", sorted(GRADIENT_POISONS))
def test_a_non_finite_gradient_with_a_finite_loss_is_skipped(poison):
    def loss_fn(params, buffers, batch):
        x, y, _ = batch
        w = params["0.weight"]
        return (x @ w.T).sum(1) + GRADIENT_POISONS[poison](w) + y.float()

    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1))
    state = step.init(PARAMS, BUFFERS, key=sbrandom.key(0), total_steps=64)
    after, metrics = step(state, _batch(4))
    assert torch.isfinite(metrics.loss) and bool(metrics.skipped)
    assert int(after.time.updates_skipped) == 1
    assert all(torch.equal(after.params[k], state.params[k]) for k in state.params)
    raising = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1), nonfinite="raise")
    with pytest.raises(FloatingPointError, match="not finite"):
        raising(raising.init(PARAMS, BUFFERS, key=sbrandom.key(0), total_steps=64), _batch(4))


def test_fit_counts_an_empty_batch_in_the_data_as_skipped():
    step = sbfunc.make_train_step(TRAIN_LOSS, sbfunc.optim.sgd(0.1))
    state = step.init(PARAMS, BUFFERS, key=sbrandom.key(0), total_steps=64)
    data = [_batch(4, seed=0), _batch(0), _batch(4, seed=2)]
    out = sbfunc.fit(step, state, data, epochs=2, progress=False)
    assert int(out.state.time.updates_skipped) == 2 and out.state.time.step == 6


def _corrupt(n: int, rows: list[int], seed: int = 0):
    x, y, ids = _batch(n, seed=seed)
    x = x.clone()
    x[rows, 0] = float("nan")
    return x, y, ids


@pytest.mark.parametrize("name", ["plain", "sb_rank_power", "sb_policy_jiang", "sb_top_k"])
def test_fit_warns_once_about_corrupt_rows_with_or_without_selection(name):
    # With selection the corrupt rows are left out by the policy, not masked by the step's
    # guard: they count in the same counter, so fit warns the same way.
    step = sbfunc.make_train_step(TRAIN_LOSS, sbfunc.optim.sgd(0.1), PATHS[name]())
    state = step.init(PARAMS, BUFFERS, key=sbrandom.key(0))
    data = [_corrupt(8, [1, 5]), _batch(8, seed=2), _corrupt(8, [0], seed=3)]
    with pytest.warns(sbfunc.step.NonFiniteRowsWarning, match="non-finite input") as caught:
        out = sbfunc.fit(step, state, data, epochs=2, progress=False)
    assert sum(issubclass(w.category, sbfunc.step.NonFiniteRowsWarning) for w in caught) == 1
    assert int(out.state.time.rows_nonfinite) == 6
    assert [int(m.rows_nonfinite) for m in out.history] == [2, 0, 1] * 2


@pytest.mark.parametrize("name", ["plain", *(n for n in sorted(PATHS) if n.startswith("sb_"))])
@SETTINGS
@given(rows=st.sets(st.integers(0, 7), min_size=1, max_size=3))
def test_every_corrupt_row_is_counted_once_on_every_selection_path(name, rows):
    before, after, metrics = _run(PATHS[name](), _corrupt(8, sorted(rows)))
    assert int(metrics.rows_nonfinite) == len(rows)
    assert int(after.time.rows_nonfinite) == int(before.time.rows_nonfinite) + len(rows)
