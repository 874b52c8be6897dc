"""Every policy through the same invariants: a valid Selection, purity, determinism per key,
checkpoint round trips, and clear errors without ids."""

from __future__ import annotations

import io

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sbfunc import checkpoint
from sbfunc import random as sbrandom
from sbfunc.policies import (
    Policy,
    bayesian,
    divbs,
    grad_norm_importance,
    infobatch,
    jiang_cdf,
    loshchilov,
    random_subset,
    rank_power,
    rho_loss,
    stale_sb,
    top_k,
)
from sbfunc.score import Signals

NUM_IDS = 64
NUM_FEATURES, NUM_CLASSES = 8, 3  # the head of test_devices.py's model

POLICIES = {
    "rank_power": lambda: rank_power(0.5),
    "top_k": lambda: top_k(0.3),
    "random": lambda: random_subset(0.5),
    "jiang": lambda: jiang_cdf(2.0, history=16, sampling_min=0.05),
    "jiang_reweight": lambda: jiang_cdf(1.0, history=16, reweight=True),
    "stale_sb": lambda: stale_sb(1.0, num_ids=NUM_IDS, max_age=2, history=16),
    "loshchilov": lambda: loshchilov(10.0, 0.5, num_ids=NUM_IDS),
    "grad_norm": lambda: grad_norm_importance(0.5, smoothing=0.0),
    "grad_norm_always": lambda: grad_norm_importance(0.5, switch=False),
    "grad_norm_fixed": lambda: grad_norm_importance(0.5, switch=False, fixed_size=True),
    "rho_loss": lambda: rho_loss(0.5, torch.linspace(0, 1, NUM_IDS)),
    "infobatch": lambda: infobatch(0.5, 0.9, num_ids=NUM_IDS),
    "divbs": lambda: divbs(0.5),
    "bayesian": lambda: bayesian(0.5, num_features=NUM_FEATURES, num_classes=NUM_CLASSES, draws=8),
    "bayesian_ref": lambda: bayesian(
        0.3,
        num_features=NUM_FEATURES,
        num_classes=NUM_CLASSES,
        reference_losses=torch.linspace(0, 2, NUM_IDS),
        draws=4,
    ),
}
NEEDS_IDS = {"stale_sb", "loshchilov", "rho_loss", "infobatch", "bayesian_ref"}
ZERO_WEIGHT_PADDING = {"grad_norm_fixed"}  # a fixed count: undrawn rows kept with weight 0

batches = st.integers(1, 24).flatmap(
    lambda n: st.tuples(
        st.lists(st.floats(0, 10, allow_nan=False, width=32), min_size=n, max_size=n),
        st.permutations(range(NUM_IDS)).map(lambda p: p[:n]),
    )
)


def signals_for(policy: Policy, n: int, seed: int = 0) -> Signals | None:
    """Random signals of ``n`` rows for a policy that needs them (``None`` otherwise)."""
    if not policy.needs:
        return None
    g = torch.Generator().manual_seed(seed)
    return Signals(
        torch.randn(n, NUM_CLASSES, generator=g),
        torch.randn(n, NUM_FEATURES, generator=g),
        torch.randint(0, NUM_CLASSES, (n,), generator=g),
    )


def run(policy: Policy, steps, seed: int, as_tensors: bool = False, dtype=None):
    """Apply the policy over a few batches; returns the selections and the states. With
    ``as_tensors`` the epoch and elapsed time come as 0-d tensors (as inside a step); scores
    have ``dtype`` (``None``: as ``torch.tensor`` infers it)."""
    state, out = policy.init(), []
    for t, (losses, ids) in enumerate(steps):
        scores, id_t = torch.tensor(losses, dtype=dtype), torch.tensor(ids)
        before = (scores.clone(), id_t.clone())
        epoch, elapsed = t // 2, t / len(steps)
        if as_tensors:
            epoch, elapsed = torch.tensor(epoch), torch.tensor(elapsed, dtype=torch.float32)
        sel, state = policy.select(
            scores,
            state,
            key=sbrandom.fold_in(sbrandom.key(seed), t),
            ids=id_t,
            epoch=epoch,
            elapsed=elapsed,
            signals=signals_for(policy, len(losses), seed + t),
        )
        assert torch.equal(scores, before[0]) and torch.equal(id_t, before[1])  # no mutation
        out.append((sel, state))
    return out


@pytest.mark.parametrize("name", sorted(POLICIES))
@settings(max_examples=15, deadline=None, derandomize=True, database=None)
@given(steps=st.lists(batches, min_size=1, max_size=4), seed=st.integers(0, 2**16))
def test_selection_is_valid_and_deterministic_per_key(name, steps, seed):
    policy = POLICIES[name]()
    first, second = run(policy, steps, seed), run(policy, steps, seed)
    for (losses, _), (sel, _state), (sel2, _) in zip(steps, first, second, strict=True):
        n = len(losses)
        idx = sel.indices
        assert idx.dtype == torch.int64 and 1 <= idx.shape[0] <= n
        assert bool((idx[1:] > idx[:-1]).all()) and int(idx.min()) >= 0 and int(idx.max()) < n
        if sel.weights is not None:
            assert sel.weights.shape == idx.shape
            positive = sel.weights >= 0 if name in ZERO_WEIGHT_PADDING else sel.weights > 0
            assert bool(positive.all() and torch.isfinite(sel.weights).all())
        assert torch.equal(idx, sel2.indices)
        assert (sel.weights is None) == (sel2.weights is None)
        if sel.weights is not None:
            assert torch.equal(sel.weights, sel2.weights)


@pytest.mark.parametrize("name", sorted(POLICIES))
@settings(max_examples=8, deadline=None, derandomize=True, database=None)
@given(steps=st.lists(batches, min_size=1, max_size=4), seed=st.integers(0, 2**16))
def test_epoch_and_elapsed_as_tensors_select_like_python_numbers(name, steps, seed):
    policy = POLICIES[name]()
    assert_same_runs(run(policy, steps, seed), run(policy, steps, seed, as_tensors=True))


def assert_same_runs(a, b):
    """Two runs of :func:`run` made the same selections and states."""
    for (sel, state), (sel_b, state_b) in zip(a, b, strict=True):
        assert torch.equal(sel.indices, sel_b.indices)
        assert (sel.weights is None) == (sel_b.weights is None)
        if sel.weights is not None:
            assert torch.equal(sel.weights, sel_b.weights)
        x, y = checkpoint.to_state_dict(state), checkpoint.to_state_dict(state_b)
        assert x["structure"] == y["structure"]
        for u, v in zip(x["leaves"], y["leaves"], strict=True):
            assert torch.equal(u, v) if isinstance(u, torch.Tensor) else u == v


int_batches = st.integers(1, 24).flatmap(
    lambda n: st.tuples(
        st.lists(st.integers(0, 40), min_size=n, max_size=n),
        st.permutations(range(NUM_IDS)).map(lambda p: p[:n]),
    )
)


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
@settings(max_examples=6, deadline=None, derandomize=True, database=None)
@given(steps=st.lists(int_batches, min_size=1, max_size=3), seed=st.integers(0, 2**16))
def test_integer_scores_select_the_rows_of_the_same_scores_as_floats(name, dtype, steps, seed):
    # Composer's test scores with an int64 fake loss; every policy casts in one place
    # (sbfunc.policies._base.as_scores) to the default float dtype.
    if dtype == torch.bool:
        steps = [([v % 2 for v in losses], ids) for losses, ids in steps]
    policy = POLICIES[name]()
    exact = run(policy, steps, seed, dtype=dtype)
    assert_same_runs(exact, run(policy, steps, seed, dtype=torch.get_default_dtype()))


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_state_round_trips_through_a_weights_only_checkpoint(name):
    policy = POLICIES[name]()
    steps = [([float(i % 5) for i in range(12)], list(range(12, 24)))] * 3
    _, state = run(policy, steps, seed=3)[-1]
    buf = io.BytesIO()
    torch.save(checkpoint.to_state_dict(state), buf)
    buf.seek(0)
    loaded = checkpoint.from_state_dict(torch.load(buf, weights_only=True), policy.init())
    assert type(loaded) is type(state)
    for a, b in zip(
        checkpoint.to_state_dict(state)["leaves"],
        checkpoint.to_state_dict(loaded)["leaves"],
        strict=True,
    ):
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
    # the restored state selects exactly like the original
    scores, ids, key = torch.rand(12), torch.arange(12), sbrandom.key(9)
    signals = signals_for(policy, 12)
    s1, _ = policy.select(scores, state, key=key, ids=ids, epoch=5, signals=signals)
    s2, _ = policy.select(scores, loaded, key=key, ids=ids, epoch=5, signals=signals)
    assert torch.equal(s1.indices, s2.indices)


@pytest.mark.parametrize("name", sorted(NEEDS_IDS))
def test_id_policies_refuse_a_call_without_ids(name):
    policy = POLICIES[name]()
    kw = {"key": sbrandom.key(0), "signals": signals_for(policy, 4)}
    with pytest.raises(ValueError, match="needs sample ids"):
        policy.select(torch.rand(4), policy.init(), **kw)
    with pytest.raises(ValueError, match="shape"):
        policy.select(torch.rand(4), policy.init(), ids=torch.arange(3), **kw)
    with pytest.raises(TypeError, match="integer"):
        policy.select(torch.rand(4), policy.init(), ids=torch.rand(4), **kw)


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize(
    ("scores", "error"),
    [
        (torch.zeros(2, 2), ValueError),
        ([0.0, 1.0, 2.0], TypeError),
        (torch.zeros(3, dtype=torch.complex64), TypeError),
    ],
)
def test_bad_scores_are_refused(name, scores, error):
    policy = POLICIES[name]()
    with pytest.raises(error, match="scores"):
        policy.select(scores, policy.init(), key=sbrandom.key(0), ids=torch.arange(3))


@pytest.mark.parametrize(
    "make",
    [
        lambda: rank_power(0.0),
        lambda: top_k(1.5),
        lambda: random_subset(True),
        lambda: jiang_cdf(0.0),
        lambda: jiang_cdf(1.0, history=0),
        lambda: jiang_cdf(1.0, sampling_min=1.5),
        lambda: stale_sb(1.0, num_ids=0),
        lambda: stale_sb(1.0, num_ids=4, max_age=0),
        lambda: loshchilov(0.5, 0.5, num_ids=4),
        lambda: loshchilov(10.0, 0.0, num_ids=4),
        lambda: grad_norm_importance(0.5, smoothing=1.0),
        lambda: rho_loss(0.5, torch.zeros(2, 2)),
        lambda: rho_loss(0.5, torch.arange(3)),
        lambda: infobatch(1.0, num_ids=4),
        lambda: infobatch(0.5, 1.5, num_ids=4),
        lambda: infobatch(0.5, num_ids=-1),
        lambda: divbs(0.0),
        lambda: bayesian(0.5, num_features=0, num_classes=2),
        lambda: bayesian(0.5, num_features=2, num_classes=2.0),
        lambda: bayesian(0.5, num_features=2, num_classes=2, alpha=1.5),
        lambda: bayesian(0.5, num_features=2, num_classes=2, draws=0),
        lambda: bayesian(0.5, num_features=2, num_classes=2, decay=1.0),
        lambda: bayesian(0.5, num_features=2, num_classes=2, prior_precision=0.0),
        lambda: bayesian(0.5, num_features=2, num_classes=2, num_effective_data=-1),
        lambda: bayesian(0.5, num_features=2, num_classes=2, reference_losses=torch.arange(3)),
    ],
)
def test_bad_arguments_fail_at_construction(make):
    with pytest.raises((ValueError, TypeError)) as info:
        make()
    words = "keep beta history sampling_min num_ids max_age s_e smoothing irreducible reference"
    words += " num_features num_classes alpha draws decay prior_precision num_effective_data"
    assert any(word in str(info.value) for word in (*words.split(), "prune_ratio", "delta"))
