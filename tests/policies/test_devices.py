"""Every policy on the ``meta`` device (tensors without data): a host read or a device mix
raises there, exactly where an accelerator would sync or fail. Fixed-count rules run end to
end; variable-size ones read the kept count at one place only (docs/how-to/compile.md)."""

import pytest
import torch
import torch.nn.functional as F

import sbfunc
from sbfunc import random as sbrandom
from tests.meta import META, sync_site
from tests.meta import empty as _meta
from tests.policies.test_registry import NUM_CLASSES, NUM_FEATURES, POLICIES

SYNC_FREE = {"rank_power", "top_k", "random", "loshchilov", "rho_loss", "grad_norm_fixed"}
SYNC_FREE |= {"divbs", "bayesian", "bayesian_ref"}
# variable-size selections: the one shape read, by file and function
SYNCS_AT = {
    "jiang": ("policies/_base.py", "bernoulli_selection"),
    "jiang_reweight": ("policies/_base.py", "bernoulli_selection"),
    "stale_sb": ("policies/_base.py", "bernoulli_selection"),
    "infobatch": ("policies/_base.py", "bernoulli_selection"),
    "grad_norm": ("policies/_importance.py", "rule"),
    "grad_norm_always": ("policies/_importance.py", "rule"),
}
# inside Selective Backprop, loss reuse scores a data-dependent subset of rows
REUSE_SYNCS_AT = ("selective_backprop/_apply.py", "needed_scores")


def _select_twice(name):
    policy = POLICIES[name]()
    state = policy.init()  # built on the CPU: it follows the scores to their device
    for t in range(2):
        _, state = policy.select(
            _meta(12),
            state,
            key=sbrandom.key(t).to(META),
            ids=_meta(12, dtype=torch.int64),
            epoch=torch.tensor(t, device=META),
            elapsed=torch.tensor(0.5, device=META),
            signals=_meta_signals(12) if policy.needs else None,
        )
    return state


def _meta_signals(n):
    logits, features = _meta(n, NUM_CLASSES), _meta(n, NUM_FEATURES)
    return sbfunc.score.Signals(logits, features, _meta(n, dtype=torch.int64))


def test_every_policy_is_classified():
    assert SYNC_FREE | SYNCS_AT.keys() == POLICIES.keys()


@pytest.mark.parametrize("name", sorted(SYNC_FREE))
def test_fixed_count_policies_never_read_the_device(name):
    state = _select_twice(name)
    leaves = [x for x in torch.utils._pytree.tree_leaves(state) if isinstance(x, torch.Tensor)]
    assert all(x.device == META for x in leaves)  # the state moved to the data's device


@pytest.mark.parametrize("name", sorted(SYNCS_AT))
def test_variable_size_policies_read_only_the_kept_count(name):
    with pytest.raises(NotImplementedError, match="nonzero") as error:
        _select_twice(name)
    assert sync_site(error.value) == SYNCS_AT[name]


@pytest.mark.parametrize("name", sorted(n for n in POLICIES if POLICIES[n]().record is not None))
def test_record_and_score_rows_stay_on_the_device(name):
    policy = POLICIES[name]()
    ids = _meta(6, dtype=torch.int64)
    state = policy.record(policy.init(), ids, _meta(6), torch.tensor(0, device=META))
    if policy.score_rows is not None:
        assert policy.score_rows(state, ids, torch.tensor(1, device=META)).device == META


def _sb_step(name):
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    sb = sbfunc.SelectiveBackprop(start=0.0, end=1.0, policy=POLICIES[name](), ids=2, interrupt=0)
    step = sbfunc.make_train_step(
        sbfunc.per_sample_loss(model, F.cross_entropy), sbfunc.optim.adam(1e-3), [sb]
    )
    params, buffers = sbfunc.split_module(model, clone=True)
    state = step.init(
        {k: v.to(META) for k, v in params.items()},
        {k: v.to(META) for k, v in buffers.items()},
        key=sbrandom.key(0).to(META),
        total_steps=4,
    )
    batch = (_meta(16, 4), _meta(16, dtype=torch.int64), _meta(16, dtype=torch.int64))
    for _ in range(2):
        state, metrics = step(state, batch)
    return state, metrics


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_selective_backprop_step_syncs_only_where_documented(name):
    reuses = POLICIES[name]().score_rows is not None
    if name in SYNC_FREE and not reuses:
        state, metrics = _sb_step(name)
        assert 0 < metrics.samples_backpropagated < 16  # selected, on the meta device
        assert all(v.device == META for v in state.params.values())
        return
    with pytest.raises(NotImplementedError, match="nonzero") as error:
        _sb_step(name)
    assert sync_site(error.value) == (REUSE_SYNCS_AT if reuses else SYNCS_AT[name])
