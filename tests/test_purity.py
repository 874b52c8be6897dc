"""The pure contract, proved for every public function that takes parameters, buffers, a batch
or a state: every input tensor is bit for bit unchanged afterwards and was never written in
place (``tensor._version``, bumped by every in-place write, is the same).

Models with BatchNorm left in train mode and dropout, on tuple batches ``(x, y, ids)``, dict
batches with a string field and the nested pytree batches of :mod:`sbfunc.testing`. The
loss-level functions, evaluation, scoring, selection and the per-sample transforms run on
hypothesis-drawn batches; the step (eager and compiled), ``fit`` and every algorithm of the
suite run through the small factories in the "step" section, which are the only place that
builds a step.
"""

from __future__ import annotations

import copy
import functools
from typing import Any, NamedTuple

import optree
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import sbfunc
from sbfunc import per_sample as P
from sbfunc import policies
from sbfunc import random as sbrandom
from sbfunc.per_sample import batch_grad, batch_l2_grad, sum_grad_squared, variance
from sbfunc.testing import linear_loss, states
from tests.algorithms import test_registry as algorithm_registry
from tests.helpers import assert_identical
from tests.policies.test_registry import POLICIES, signals_for

FEATURES, CLASSES = 4, 3
EXAMPLES = settings(max_examples=12, deadline=None, derandomize=True, database=None)


# --- the witness ------------------------------------------------------------------------------


class Witness(NamedTuple):
    """Copies of some pytrees and the version counter of each of their tensors."""

    trees: Any
    copies: Any
    versions: list[int]


def _expand(trees: Any) -> Any:
    """The trees with each module replaced by its own parameters and buffers (a function that
    takes a module must not write those either)."""

    def leaf(x: Any) -> Any:
        module = x.module if isinstance(x, sbfunc.module.ModuleLoss) else x
        if isinstance(module, nn.Module):
            return (dict(module.named_parameters()), dict(module.named_buffers()))
        if x is None or isinstance(x, torch.Tensor | str | int | float | bytes):
            return x
        return type(x).__name__  # a function, a step: compared by kind only

    return optree.tree_map(leaf, trees, none_is_leaf=True)


def _tensors(trees: Any) -> list[torch.Tensor]:
    leaves = optree.tree_leaves(trees, none_is_leaf=True)
    return [t for t in leaves if isinstance(t, torch.Tensor)]


def witness(*trees: Any) -> Witness:
    expanded = _expand(trees)
    return Witness(expanded, copy.deepcopy(expanded), [t._version for t in _tensors(expanded)])


def assert_untouched(w: Witness) -> None:
    """Every tensor of the witnessed trees is bit for bit its copy and was not written."""
    assert_identical(w.trees, w.copies)
    written = [
        (i, tuple(t.shape))
        for i, (t, v) in enumerate(zip(_tensors(w.trees), w.versions, strict=True))
        if t._version != v
    ]
    assert not written, f"written in place (leaf index, shape): {written}"


def check_pure(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call ``fn(*args, **kwargs)`` and assert that it left every argument untouched."""
    w = witness(args, kwargs)
    out = fn(*args, **kwargs)
    assert_untouched(w)
    return out


def test_the_witness_sees_writes_even_when_the_bytes_come_back():
    x = torch.ones(3)
    with pytest.raises(AssertionError):
        check_pure(lambda t: t.add_(1), x)
    with pytest.raises(AssertionError, match="written in place"):
        check_pure(lambda t: t.mul_(1.0), x)  # same bytes, but written
    model = nn.BatchNorm1d(2)
    with pytest.raises(AssertionError):
        check_pure(lambda m, t: m(t), model, torch.randn(4, 2))  # train mode: its statistics


# --- models and batches -----------------------------------------------------------------------


class Net(nn.Module):
    """Linear, BatchNorm (train mode), dropout: every way a forward can depend on its mode."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(FEATURES, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.3)
        )
        self.head = nn.Linear(8, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def net() -> nn.Module:
    torch.manual_seed(0)
    return Net().train()


def _fields(kind: str) -> dict[str, Any]:
    return {"input": 0, "target": 1} if kind == "tuple" else {"input": "x", "target": "y"}


def loss_for(model: nn.Module, kind: str, **kw: Any) -> sbfunc.module.ModuleLoss:
    return sbfunc.per_sample_loss(model, F.cross_entropy, **_fields(kind), **kw)


def make_batch(kind: str, n: int, seed: int) -> Any:
    """A tuple ``(x, y, ids)`` or a dict with a list-of-strings field, from a key."""
    kx, ky = sbrandom.split(sbrandom.key(seed))
    x = sbrandom.normal(kx, (n, FEATURES)) * 2
    y = sbrandom.randint(ky, (n,), 0, CLASSES)
    ids = torch.arange(n)
    if kind == "tuple":
        return (x, y, ids)
    return {"x": x, "y": y, "ids": ids, "path": [f"r{i}.png" for i in range(n)]}


@st.composite
def batches(
    draw: st.DrawFn, kinds: tuple[str, ...] = ("tuple", "dict"), n: int | None = None
) -> tuple[str, Any]:
    """``(kind, batch)`` of :func:`make_batch`."""
    kind = draw(st.sampled_from(kinds))
    n = draw(st.integers(2, 10)) if n is None else n
    return kind, make_batch(kind, n, draw(st.integers(0, 2**32 - 1)))


def state_dicts(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Params and buffers with non-trivial running statistics."""
    params, buffers = sbfunc.split_module(model, clone=True)
    buffers = {k: v + 0.5 if v.is_floating_point() else v + 3 for k, v in buffers.items()}
    return params, buffers


# --- per-sample losses, evaluation, scoring ---------------------------------------------------


@EXAMPLES
@given(drawn=batches())
def test_losses_evaluation_and_scoring_write_nothing(drawn):
    kind, batch = drawn
    model = net()
    params, buffers = state_dicts(model)
    for mode in ("auto", "eval"):
        loss_fn = loss_for(model, kind, mode=mode)
        check_pure(loss_fn, params, buffers, batch)
        logits = check_pure(loss_fn.forward, params, buffers, batch)
        check_pure(loss_fn.criterion, logits, batch)
    x = batch[0] if kind == "tuple" else batch["x"]
    check_pure(sbfunc.predict, model, params, buffers, x)
    for mode in ("train", "eval", "module", "auto"):  # eval mode whatever the loss's own mode
        check_pure(
            sbfunc.module._eval.eval_outputs,
            loss_for(model, kind, mode=mode),
            params,
            buffers,
            batch,
        )
    fields = {"input": 0} if kind == "tuple" else {"input": "x"}
    check_pure(sbfunc.score.score_losses, loss_for(model, kind), params, buffers, batch, **fields)
    assert model.training and all(m.training for m in model.modules())


@EXAMPLES
@given(drawn=batches(), subset=st.booleans())
def test_per_sample_transforms_write_nothing(drawn, subset):
    kind, batch = drawn
    model = net()
    params, buffers = state_dicts(model)
    loss_fn = loss_for(model, kind)
    idx = torch.tensor([0, sbfunc.batch.batch_size(batch) - 1]) if subset else None
    for transform in (batch_grad, batch_l2_grad, sum_grad_squared, variance):
        check_pure(transform(loss_fn), params, buffers, batch, subsampling=idx)


@settings(max_examples=4, deadline=None, derandomize=True, database=None)
@given(drawn=batches(), seed=st.integers(0, 2**16))
def test_curvature_transforms_write_nothing(drawn, seed):
    kind, batch = drawn
    model = net()
    params, buffers = state_dicts(model)
    loss_fn = loss_for(model, kind)  # eval mode: curvature needs samples that do not interact
    idx = torch.tensor([sbfunc.batch.batch_size(batch) - 1, 0])
    for exact in (P.sqrt_ggn_exact, P.diag_ggn_exact, P.batch_diag_ggn_exact):
        check_pure(exact(loss_fn), params, buffers, batch, subsampling=idx)
    key = sbrandom.key(seed)
    for mc in (P.sqrt_ggn_mc, P.diag_ggn_mc, P.batch_diag_ggn_mc):
        check_pure(mc(loss_fn), params, buffers, batch, key=key, subsampling=idx)
    v = {k: torch.ones_like(p) for k, p in params.items()}
    check_pure(P.ggn_vector_product(loss_fn), params, buffers, batch, v, subsampling=idx)
    check_pure(P.ggn_eigen(loss_fn, k=2), params, buffers, batch, subsampling=idx)


@EXAMPLES
@given(state=states())
def test_pytree_batches_and_a_hand_written_loss(state):
    """The nested batches of sbfunc.testing (tuple leaves, metadata, a 0-d tensor)."""
    check_pure(linear_loss, state.params, state.buffers, state.batch)
    check_pure(batch_grad(linear_loss), state.params, state.buffers, state.batch)
    check_pure(sbfunc.score.score_losses, linear_loss, state.params, state.buffers, state.batch)


@pytest.mark.xfail(
    strict=True,
    reason="a train-mode ModuleLoss writes BatchNorm statistics into the buffers it is given "
    "(the step passes copies: step.gradients.fresh_buffers); handed to the step's owner",
)
def test_train_mode_loss_called_directly_writes_nothing():
    model = net()
    params, buffers = state_dicts(model)
    batch = (torch.randn(6, FEATURES), torch.zeros(6, dtype=torch.long))
    check_pure(loss_for(model, "tuple", mode="train"), params, buffers, batch)


# --- selection, take, policies ----------------------------------------------------------------


@EXAMPLES
@given(
    scores=st.integers(1, 16).flatmap(
        lambda n: st.lists(
            st.floats(-5, 5, allow_nan=False, width=32) | st.just(float("nan")),
            min_size=n,
            max_size=n,
        )
    ),
    seed=st.integers(0, 2**16),
    keep=st.sampled_from([0.25, 0.5, 1.0]),
)
def test_selection_and_take_write_nothing(scores, seed, keep):
    s, key = torch.tensor(scores), sbrandom.key(seed)
    n = s.shape[0]
    check_pure(sbfunc.select.ranks, s, key=key)
    for make in (policies.rank_power, policies.top_k, policies.random_subset):
        check_pure(make(keep).select, s, sbfunc.types.EmptyState(), key=key)
    log_w = check_pure(
        sbfunc.policies.rank_power_log_weights, sbfunc.select.ranks(s, key=key), keep
    )
    gumbel = sbrandom.gumbel(key, (n,))
    sel = check_pure(sbfunc.select.gumbel_top_k, log_w, sbfunc.select.kept_count(n, keep), gumbel)
    batch = {"x": torch.randn(n, 2), "ids": torch.arange(n), "name": [str(i) for i in range(n)]}
    check_pure(sbfunc.batch.take, batch, sel)


@pytest.mark.parametrize("name", sorted(POLICIES))
@settings(max_examples=6, deadline=None, derandomize=True, database=None)
@given(n=st.integers(1, 16), seed=st.integers(0, 2**16))
def test_every_policy_writes_nothing(name, n, seed):
    policy = POLICIES[name]()
    state = policy.init()
    key = sbrandom.key(seed)
    for t in range(3):  # a few steps, so the state holds history
        scores = sbrandom.uniform(sbrandom.fold_in(key, t), (n,)) * 5
        ids = torch.randperm(64, generator=torch.Generator().manual_seed(seed + t))[:n]
        kwargs = {"key": sbrandom.fold_in(key, 100 + t), "ids": ids, "epoch": t, "elapsed": t / 3}
        signals = signals_for(policy, n, seed + t)
        _, state = check_pure(policy.select, scores, state, signals=signals, **kwargs)


def test_select_using_loss_writes_nothing_it_is_given():
    model = net()
    x, y = torch.randn(8, FEATURES), torch.randint(0, CLASSES, (8,))
    w = witness(x, y, dict(model.named_parameters()), dict(model.named_buffers()))
    g = torch.Generator().manual_seed(0)
    sbfunc.compat.select_using_loss(
        x, y, model, F.cross_entropy, keep=0.5, generator=g, train=False
    )
    assert_untouched(w)


# --- the step, fit, every algorithm: built only through these factories ----------------------


def make_step(loss_fn: Any, algorithms: list[Any], optimizer: Any = None) -> Any:
    """A training step (the one place that calls make_train_step)."""
    optimizer = sbfunc.optim.adam(1e-2) if optimizer is None else optimizer
    return sbfunc.make_train_step(loss_fn, optimizer, algorithms)


def init_state(step: Any, model: nn.Module) -> Any:
    return step.init(*state_dicts(model), key=sbrandom.key(0))


def sb_step(model: nn.Module, kind: str) -> Any:
    """Selective Backprop (selecting from the first step) chained with label smoothing."""
    train = loss_for(model, kind, mode="train")
    sb = sbfunc.SelectiveBackprop(0.0, 1.0, keep=0.5, interrupt=0)  # scores with the step loss
    smoothing = sbfunc.algorithms.LabelSmoothing(
        0.1, num_classes=CLASSES, target=_fields(kind)["target"]
    )
    return make_step(train, [sbfunc.sequence(sb, smoothing)])


def eval_fn_for(loss_fn: Any) -> Any:
    def eval_fn(params: Any, buffers: Any, batch: Any) -> dict[str, torch.Tensor]:
        return {
            "loss": sbfunc.module._eval.eval_outputs(loss_fn, params, buffers, batch).losses.mean()
        }

    return eval_fn


@settings(max_examples=6, deadline=None, derandomize=True, database=None)
@given(drawn=batches(n=6))
def test_eager_step_writes_nothing(drawn):
    kind, batch = drawn
    model = net()
    step = sb_step(model, kind)
    state = init_state(step, model)
    new, _ = check_pure(step, state, batch)
    check_pure(step, new, batch)  # a state the step made is as safe
    assert not torch.equal(
        new.buffers["body.1.running_mean"], state.buffers["body.1.running_mean"]
    )


@functools.cache
def _compiled() -> tuple[Any, nn.Module]:
    """One compiled step shared by the compiled cases. ``aot_eager`` runs AOTAutograd's
    functionalization, which decides whether a compiled graph writes its inputs back, as
    inductor does, without inductor's code generation (a minute per graph on 2 cores)."""
    model = net()
    return torch.compile(sb_step(model, "tuple"), backend="aot_eager"), model


@settings(max_examples=2, deadline=None, derandomize=True, database=None)
@given(drawn=batches(kinds=("tuple",), n=8))
def test_compiled_step_writes_nothing(drawn):
    _, batch = drawn
    step, model = _compiled()
    state = init_state(step, model)
    new, _ = check_pure(step, state, batch)
    check_pure(step, new, batch)


def test_fit_evaluation_and_checkpoint_write_nothing(tmp_path):
    model = net()
    loss_fn = loss_for(model, "dict")
    step = sb_step(model, "dict")
    state = init_state(step, model)
    data = [make_batch("dict", 8, seed) for seed in range(2)]
    kwargs = {
        "epochs": 2,
        "progress": False,
        "evaluator": sbfunc.step.Evaluator(data[:1], eval_fn_for(loss_fn)),
    }
    result = check_pure(
        sbfunc.fit,
        step,
        state,
        data,
        **kwargs,
        checkpointing=sbfunc.step.Checkpointing(save_to=tmp_path / "s{step}.pt"),
    )
    check_pure(sbfunc.step.evaluate, step, result.state, data, eval_fn_for(loss_fn))
    check_pure(sbfunc.checkpoint.save, result.state, tmp_path / "final.pt")


@pytest.mark.parametrize("name", list(algorithm_registry.CASES))
def test_every_algorithm_writes_nothing(name):
    """Every algorithm of the suite, with Selective Backprop, through fit (every event)."""
    case = algorithm_registry.CASES[name]
    torch.manual_seed(0)
    plain = (
        algorithm_registry.ImageNet() if case.kind == "image" else algorithm_registry.TokenNet()
    )
    model = case.surgery(plain).train()
    train = algorithm_registry._loss(model, case.kind, "train")
    algorithms = [*case.algorithms(model, train), algorithm_registry._sb(model, case.kind)]
    step = make_step(train, algorithms, case.optimizer or sbfunc.optim.sgd(0.1))
    state = init_state(step, model)
    data = algorithm_registry._data(case.kind)[:2]
    eval_fn = eval_fn_for(algorithm_registry._loss(model, case.kind, "eval"))
    run = {"epochs": 1, "progress": False, "evaluator": sbfunc.step.Evaluator(data[:1], eval_fn)}
    check_pure(sbfunc.fit, step, state, data, **run)
