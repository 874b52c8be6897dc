"""apply_if_finite and the fused check: a non-finite update leaves the parameters and the inner
state bit for bit and is counted; a finite one is the inner update bit for bit; the check agrees
with ``isfinite`` and leaves its tensors as they are."""

from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sbfunc import optim
from sbfunc.optim._apply_if_finite import host_flag
from tests.helpers import assert_identical
from tests.optim.helpers import grad_sequence, model_params

SETTINGS = settings(max_examples=30, derandomize=True, database=None, deadline=None)
BAD = [float("nan"), float("inf"), -float("inf")]


def _poison(grads, key_index, value):
    k = list(grads)[key_index]
    g = grads[k].clone().reshape(-1)
    g[0] = value
    return {**grads, k: g.reshape(grads[k].shape)}


@SETTINGS
@given(
    bad_steps=st.sets(st.integers(0, 5)),
    key_index=st.integers(0, 5),
    value=st.sampled_from(BAD),
    compiled_path=st.booleans(),
)
def test_non_finite_updates_are_skipped_bit_for_bit_and_counted(
    bad_steps, key_index, value, compiled_path
):
    path = (lambda flag: None) if compiled_path else host_flag  # torch.where, or a branch
    with mock.patch("sbfunc.optim._apply_if_finite.host_flag", path):
        inner = optim.adam(optim.cosine_decay_schedule(0.1, 5), weight_decay=0.1)
        opt = optim.apply_if_finite(inner)
        params = model_params()
        p_ref, s_ref = params, inner.init(params)
        p, s = params, opt.init(params)
        for i, g in enumerate(grad_sequence(params, steps=6)):
            if i in bad_steps:
                g = _poison(g, key_index, value)
            updates, s = opt.update(g, s, p)
            p = optim.apply_updates(p, updates)
            if i not in bad_steps:
                u_ref, s_ref = inner.update(g, s_ref, p_ref)
                p_ref = optim.apply_updates(p_ref, u_ref)
            assert_identical(p, p_ref)
            assert_identical(s.inner_state, s_ref)
            assert bool(s.last_finite) == (i not in bad_steps)
        assert int(s.total_notfinite) == len(bad_steps)


def test_consecutive_errors_past_the_limit_are_applied_and_the_count_resets():
    opt = optim.apply_if_finite(optim.sgd(1.0), max_consecutive_errors=2)
    state = opt.init({"w": torch.zeros(1)})
    seen = []
    for g in [float("nan")] * 3 + [1.0, float("nan")]:
        updates, state = opt.update({"w": torch.tensor([g])}, state)
        seen.append((int(state.notfinite_count), bool(updates["w"].isnan().any())))
    # the third NaN in a row goes through (optax's rule); a finite update resets the count
    assert seen == [(1, False), (2, False), (3, True), (0, False), (1, False)]
    assert int(state.total_notfinite) == 4


@settings(max_examples=40, derandomize=True, database=None, deadline=None)
@given(
    shapes=st.lists(st.sampled_from([(), (1,), (5,), (2, 3)]), min_size=1, max_size=4),
    dtypes=st.lists(st.sampled_from([torch.float32, torch.float64, torch.bfloat16]), min_size=4),
    bad=st.one_of(st.none(), st.tuples(st.integers(0, 3), st.sampled_from(BAD))),
)
def test_all_finite_agrees_with_isfinite_and_leaves_its_tensors(shapes, dtypes, bad):
    gen = torch.Generator().manual_seed(0)
    tensors = [torch.randn(s, generator=gen).to(d) for s, d in zip(shapes, dtypes, strict=False)]
    if bad is not None and bad[0] < len(tensors) and tensors[bad[0]].numel():
        tensors[bad[0]].view(-1)[0] = bad[1]
    before = [t.clone() for t in tensors]
    versions = [t._version for t in tensors]
    got = optim.all_finite(tensors)
    assert bool(got) == all(bool(torch.isfinite(t).all()) for t in tensors)
    assert_identical(tensors, before)
    assert [t._version for t in tensors] == versions


def test_all_finite_takes_expanded_views_and_a_flag_to_combine():
    expanded = torch.tensor([1.0]).expand(4)  # what torch.func.grad returns for x.sum()
    assert bool(optim.all_finite([expanded]))
    assert not bool(optim.all_finite([expanded], finite=torch.tensor(False)))
    assert bool(optim.all_finite([]))


@pytest.mark.parametrize("finite", [True, False])
def test_keep_if_finite_selects_leafwise(finite):
    new, old = ({"a": torch.ones(2)}, 1), ({"a": torch.zeros(2)}, 2)
    out = optim.keep_if_finite(torch.tensor(finite), new, old)
    assert torch.equal(out[0]["a"], (new if finite else old)[0]["a"]) and out[1] == 1


@pytest.mark.parametrize("bad", [complex(float("nan"), 0.0), complex(1.0, float("inf"))])
def test_the_check_reads_complex_tensors_by_their_parts(bad):
    good = torch.tensor([1 + 2j, -3j], dtype=torch.complex64)
    poisoned = torch.tensor([1 + 2j, bad], dtype=torch.complex64)
    before, version = poisoned.clone(), poisoned._version
    assert bool(optim.all_finite([good])) and not bool(optim.all_finite([good, poisoned]))
    assert_identical(poisoned, before)
    assert poisoned._version == version
    guarded = optim.apply_if_finite(optim.adam(0.1))
    params = {"z": good}
    updates, state = guarded.update({"z": poisoned}, guarded.init(params), params)
    assert_identical(optim.apply_updates(params, updates), params)
    assert int(state.total_notfinite) == 1
