"""Bayesian data selection against a float64 transcription of the official code
(github.com/Pengfight/Bayesian-Data-Selection, clip_prioritized_train_bayes_ema.py), its
properties, and the policy inside a Selective Backprop step, eager and compiled."""

from __future__ import annotations

import io
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc import checkpoint
from sbfunc import random as sbrandom
from sbfunc.policies import BayesianState, bayesian, divbs
from sbfunc.policies._bayesian import _Config, _objective
from sbfunc.score import Signals

SETTINGS = settings(max_examples=10, deadline=None, derandomize=True, database=None)
D, C, S = 5, 4, 16
PAPER = {
    "alpha": 0.3,
    "draws": S,
    "decay": 0.9,
    "prior_precision": 2.0,
    "num_effective_data": 50.0,
}


def make(keep=0.5, **kw) -> sbfunc.policies.Policy:
    return bayesian(keep, num_features=D, num_classes=C, **{**PAPER, **kw})


def random_signals(n: int, seed: int) -> Signals:
    g = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(n, C, generator=g)
    return Signals(logits, torch.randn(n, D, generator=g), torch.randint(0, C, (n,), generator=g))


def random_state(seed: int, rows: int = 7) -> BayesianState:
    g = torch.Generator().manual_seed(seed)
    h, e = torch.randn(9, D, generator=g), torch.randn(9, C, generator=g)
    return BayesianState(h.T @ h / 9, e.T @ e / 9, torch.tensor(rows), None)


def official_objective(s: Signals, state: BayesianState, eps: torch.Tensor, reference=None):
    """Lines 195-198 and 337-349 of the official code, in float64."""
    out, phi, y = s.logits.double(), s.features.double(), s.targets
    n_eff, prior = PAPER["num_effective_data"], PAPER["prior_precision"]
    if int(state.rows) == 0:
        f_samples = out[:, None, :]
    else:
        v = math.sqrt(n_eff) * state.features.double()
        v.diagonal().add_(math.sqrt(prior))
        u = math.sqrt(n_eff) * state.classes.double()
        u.diagonal().add_(math.sqrt(prior))
        l_v, l_u = torch.linalg.cholesky(v), torch.linalg.cholesky(u)
        stds = (phi @ torch.cholesky_inverse(l_v) * phi).sum(-1).clamp(min=1e-6).sqrt()
        l_f = stds.view(-1, 1, 1) * l_u.T.inverse()
        f_samples = out[:, None, :] + eps.double() @ l_f
    n, s = f_samples.shape[:2]
    ce = F.cross_entropy(f_samples.flatten(0, 1), y.repeat_interleave(s), reduction="none")
    first = -ce.view(n, s).mean(1)
    third = -F.cross_entropy(f_samples.softmax(-1).mean(1).log(), y, reduction="none")
    second = 0.0 if reference is None else reference.double()
    return PAPER["alpha"] * first + (1 - PAPER["alpha"]) * second - third


def official_update(state: BayesianState, s: Signals, kept: torch.Tensor) -> BayesianState:
    """Lines 354-373 of the official code (the kept rows' features and errors), in float64."""
    phi, out, y, m = s.features[kept].double(), s.logits[kept].double(), s.targets[kept], 0.9
    grad = out.softmax(-1) - F.one_hot(y, C)
    a, g = phi.T @ phi / len(kept), grad.T @ grad / len(kept)
    if int(state.rows) != 0:
        a = state.features.double() * m + a * (1 - m)
        g = state.classes.double() * m + g * (1 - m)
    return BayesianState(a, g, state.rows + len(kept), None)


def noise(key: torch.Tensor, n: int) -> torch.Tensor:
    """The draws: ``normal(split(key)[0], (draws, C))``, shared by every row."""
    return sbrandom.normal(sbrandom.split(key)[0], (S, C)).expand(n, S, C)


@pytest.mark.parametrize("rows", [0, 7])
@pytest.mark.parametrize("with_reference", [False, True])
def test_the_objective_is_the_official_codes_for_the_same_draws(rows, with_reference):
    n, key = 12, sbrandom.key(3)
    s, state = random_signals(n, 1), random_state(2, rows)
    reference = -torch.rand(n) * 3 if with_reference else None
    cfg = _Config(0.5, *PAPER.values())
    got = _objective(torch.ones(n), s, state, reference, sbrandom.split(key)[0], cfg)
    expected = official_objective(s, state, noise(key, n), reference)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
    # and the policy keeps the rows of the k highest
    table = None if reference is None else -reference  # the reference's losses
    policy = make(reference_losses=table) if with_reference else make()
    sel, _ = policy.select(
        torch.ones(n),
        state._replace(reference_losses=table),
        key=key,
        ids=torch.arange(n),
        signals=s,
    )
    assert sel.indices.tolist() == sorted(torch.topk(expected, 6).indices.tolist())


def test_the_factors_follow_the_official_updates_of_the_kept_rows():
    policy, n = make(), 10
    state = policy.init()
    expected = BayesianState(state.features.double(), state.classes.double(), state.rows, None)
    for t in range(3):
        s = random_signals(n, t)
        sel, state = policy.select(torch.ones(n), state, key=sbrandom.key(t), signals=s)
        expected = official_update(expected, s, sel.indices)
        torch.testing.assert_close(
            state.features.double(), expected.features, rtol=1e-5, atol=1e-6
        )
        torch.testing.assert_close(state.classes.double(), expected.classes, rtol=1e-5, atol=1e-6)
        assert int(state.rows) == int(expected.rows) == 5 * (t + 1)


def test_before_any_update_it_is_rho_loss_scaled():
    n, s = 16, random_signals(16, 4)
    reference = -torch.rand(n)  # log-likelihoods; the policy takes their negation, the losses
    policy = make(reference_losses=-reference)
    sel, _ = policy.select(
        torch.ones(n), policy.init(), key=sbrandom.key(0), ids=torch.arange(n), signals=s
    )
    reducible = F.cross_entropy(s.logits, s.targets, reduction="none") + reference
    assert sel.indices.tolist() == sorted(torch.topk(reducible, 8).indices.tolist())


@SETTINGS
@given(n=st.integers(1, 12), seed=st.integers(0, 2**16), shift=st.integers(-8, 8))
def test_shifting_a_rows_logits_changes_nothing(n, seed, shift):
    s, state = random_signals(n, seed), random_state(seed)
    shifts = shift * torch.arange(n, dtype=torch.float32).unsqueeze(1) / 4
    moved = s._replace(logits=s.logits + shifts)
    a = make().select(torch.ones(n), state, key=sbrandom.key(seed), signals=s)
    b = make().select(torch.ones(n), state, key=sbrandom.key(seed), signals=moved)
    assert torch.equal(a[0].indices, b[0].indices)
    torch.testing.assert_close(a[1].classes, b[1].classes)


@SETTINGS
@given(n=st.integers(1, 12), keep=st.floats(0.05, 1.0), seed=st.integers(0, 2**16))
def test_same_key_same_result_fixed_shapes_and_uniform_reference(n, keep, seed):
    s, state, key = random_signals(n, seed), random_state(seed), sbrandom.key(seed)
    policy = make(keep)
    sel, after = policy.select(torch.ones(n), state, key=key, signals=s)
    again, after2 = policy.select(torch.ones(n), state, key=key, signals=s)
    assert torch.equal(sel.indices, again.indices) and torch.equal(after.features, after2.features)
    assert sel.indices.shape == (sbfunc.select.kept_count(n, keep),) and sel.weights is None
    for x, y in zip(after, state, strict=True):
        assert x is None if y is None else (x.shape == y.shape and x.dtype == y.dtype)
    uniform = make(keep, reference_losses=torch.full((n,), math.log(C)))
    ids = torch.arange(n)
    state_u = state._replace(reference_losses=uniform.init().reference_losses)
    assert torch.equal(
        uniform.select(torch.ones(n), state_u, key=key, ids=ids, signals=s)[0].indices,
        sel.indices,
    )


@SETTINGS
@given(
    n=st.integers(2, 12),
    keep=st.floats(0.05, 1.0),
    bad=st.lists(st.integers(0, 11), max_size=8),
    where=st.sampled_from(["scores", "logits", "features"]),
    seed=st.integers(0, 2**16),
)
def test_nonfinite_rows_rank_last_and_are_never_recorded(n, keep, bad, where, seed):
    s, scores = random_signals(n, seed), torch.ones(n)
    rows = torch.tensor(sorted({b % n for b in bad}), dtype=torch.int64)
    if where == "scores":
        scores[rows] = torch.nan
    else:
        getattr(s, where)[rows, 0] = torch.inf
    policy = make(keep)
    sel, state = policy.select(scores, policy.init(), key=sbrandom.key(seed), signals=s)
    finite = torch.ones(n, dtype=torch.bool).index_fill(0, rows, False)
    k = sbfunc.select.kept_count(n, keep)
    assert int(finite[sel.indices].sum()) == min(k, int(finite.sum())) == int(state.rows)
    assert bool(torch.isfinite(state.features).all() and torch.isfinite(state.classes).all())


def test_signals_of_another_width_are_refused():
    policy = make()
    with pytest.raises(ValueError, match="num_features=5, num_classes=4"):
        policy.select(
            torch.ones(3),
            policy.init(),
            key=sbrandom.key(0),
            signals=Signals(torch.zeros(3, C), torch.zeros(3, D + 1), torch.zeros(3).long()),
        )


def test_a_reference_shorter_than_the_ids_is_named():
    policy = make(reference_losses=torch.zeros(5))

    def select(ids):
        signals = random_signals(3, 0)
        return policy.select(torch.ones(3), policy.init(), key=sbrandom.key(0), ids=ids,
                             signals=signals)  # fmt: skip

    assert select(torch.tensor([4, 0, 2]))[0].indices.shape == (1,)
    with pytest.raises(
        ValueError, match=r"bayesian: reference_losses has 5 entries .* largest id is 5"
    ):
        select(torch.tensor([4, 5, 2]))
    with pytest.raises(ValueError, match=r"SelectiveBackprop\(ids="):
        select(None)
    with pytest.raises(ValueError, match="reference_losses must have one entry per sample id"):
        make(reference_losses=torch.zeros(0))


def _mlp_step(policy, compiled: bool):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    sb = sbfunc.SelectiveBackprop(0.0, 1.0, interrupt=0, policy=policy, ids=2)
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1), [sb])
    if compiled:
        step.compile(backend="eager", fullgraph=True)
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbrandom.key(0), total_steps=3)
    return step, state


def _batch(t: int):
    g = torch.Generator().manual_seed(t)
    return (
        torch.randn(16, 4, generator=g),
        torch.randint(0, 3, (16,), generator=g),
        torch.arange(16),
    )


POLICIES = {
    "divbs": lambda: divbs(0.25),
    "bayesian": lambda: bayesian(
        0.25, num_features=8, num_classes=3, reference_losses=torch.linspace(0, 2, 16), draws=8
    ),
}


def _run(name: str, compiled: bool, steps: int = 2):
    step, state = _mlp_step(POLICIES[name](), compiled)
    for t in range(steps):
        state, metrics = step(state, _batch(t))
        assert metrics.samples_backpropagated == 4
    return step, state


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_inside_selective_backprop_eagerly(name):
    _, state = _run(name, compiled=False)
    if name == "bayesian":
        assert int(state.algorithm_state[0].rows) == 8


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_compiled_fullgraph_step_matches_eager(name):
    _, eager = _run(name, compiled=False)
    _, compiled = _run(name, compiled=True)
    for key, value in eager.params.items():
        torch.testing.assert_close(compiled.params[key], value)


def test_the_step_state_with_bayesian_round_trips_through_a_checkpoint():
    step, state = _run("bayesian", compiled=False)
    buf = io.BytesIO()
    checkpoint.save(state, buf)
    buf.seek(0)
    loaded = checkpoint.load(buf, like=_mlp_step(POLICIES["bayesian"](), False)[1])
    a, b = step(state, _batch(5))[0], step(loaded, _batch(5))[0]
    leaves = checkpoint.to_state_dict(a)["leaves"], checkpoint.to_state_dict(b)["leaves"]
    for x, y in zip(*leaves, strict=True):
        assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y


def test_one_sign_for_every_reference_and_a_loud_refusal_of_the_other():
    """rho_loss's irreducible and bayesian's reference_losses are both losses (-log p): the
    same table serves both; a log-likelihood table (the other sign) and 1.0's reference=
    keyword are refused by name (issue 36: the natural slip, silently accepted in 1.0)."""
    losses = torch.linspace(0.1, 2.0, 8)
    sbfunc.policies.rho_loss(0.5, losses)
    make(reference_losses=losses)
    for build in (
        lambda t: sbfunc.policies.rho_loss(0.5, t),
        lambda t: make(reference_losses=t),
    ):
        with pytest.raises(ValueError, match="look like log-likelihoods; pass -"):
            build(-losses)
    with pytest.raises(TypeError, match="pass reference_losses=-reference"):
        make(reference=-losses)
