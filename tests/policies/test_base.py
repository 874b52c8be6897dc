import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sbfunc import random as sbrandom
from sbfunc.policies import (
    as_scores,
    bernoulli_selection,
    check_ids,
    check_scores,
    horvitz_thompson,
    make_policy,
)
from sbfunc.types import EmptyState
from tests.policies.helpers import assert_mean_close, kept_counts, weighted_means

probs = st.lists(st.floats(0.05, 1.0), min_size=1, max_size=12)


@settings(max_examples=15, deadline=None, derandomize=True, database=None)
@given(p=probs, seed=st.integers(0, 999))
def test_bernoulli_selection_keeps_sum_p_in_expectation_and_is_unbiased(p, seed):
    inclusion = torch.tensor([*p, 1.0])  # one certain row: the fallback never fires
    losses = sbrandom.uniform(sbrandom.key(seed), inclusion.shape) * 4
    keys = sbrandom.split(sbrandom.key(seed), 600)
    sels = [bernoulli_selection(inclusion, k, weighted=True) for k in keys]
    assert_mean_close(kept_counts(sels), float(inclusion.double().sum()))
    assert_mean_close(weighted_means(sels, losses), float(losses.double().mean()))


def test_bernoulli_selection_keeps_at_least_one_row():
    inclusion = torch.tensor([0.0, 1e-9, 0.2, 0.0])
    for k in sbrandom.split(sbrandom.key(0), 50):
        sel = bernoulli_selection(inclusion, k, weighted=False)
        assert sel.indices.shape[0] >= 1 and sel.weights is None
        if sel.indices.shape[0] == 1:
            assert sel.indices.tolist() in ([2],)


def test_horvitz_thompson_is_exactly_unbiased_for_a_fixed_design():
    # Two equally likely samples {0, 1} and {2}: pi = (1/2, 1/2, 1/2).
    losses = torch.tensor([1.0, 3.0, 8.0])
    pi = torch.full((3,), 0.5)
    est = []
    for kept in (torch.tensor([0, 1]), torch.tensor([2])):
        est.append(float((horvitz_thompson(pi, kept) * losses[kept]).mean()))
    assert math.isclose(sum(est) / 2, float(losses.mean()), rel_tol=1e-6)


def test_make_policy_packs_keyword_arguments():
    seen = {}

    def rule(scores, state, a):
        seen.update(a._asdict())
        return bernoulli_selection(torch.ones_like(scores), a.key, weighted=False), state

    policy = make_policy(EmptyState, rule)
    sel, state = policy.select(
        torch.zeros(3), policy.init(), key=sbrandom.key(0), ids=None, epoch=2, elapsed=0.5
    )
    assert sel.indices.tolist() == [0, 1, 2] and state == EmptyState()
    assert seen["epoch"] == 2 and seen["elapsed"] == 0.5
    with pytest.raises(TypeError):
        policy.select(torch.zeros(3), policy.init(), sbrandom.key(0))  # key is keyword-only


def test_bernoulli_selection_gives_a_forced_row_of_probability_zero_a_finite_weight():
    sel = bernoulli_selection(torch.zeros(4), sbrandom.key(0), weighted=True)
    assert sel.indices.shape == (1,) and sel.weights.tolist() == [0.25]  # k/N, as if pi = 1


@pytest.mark.parametrize(
    ("scores", "expected"),
    [
        (torch.tensor([3, 1, 2]), [3.0, 1.0, 2.0]),
        (torch.tensor([3, 1], dtype=torch.uint8), [3.0, 1.0]),
        (torch.tensor([True, False]), [1.0, 0.0]),
        (torch.zeros(0, dtype=torch.int64), []),
    ],
)
def test_as_scores_casts_integer_and_bool_scores_to_the_default_float_dtype(scores, expected):
    out = as_scores(scores)
    assert out.dtype == torch.get_default_dtype() and out.tolist() == expected
    assert check_scores(scores) == len(expected)
    assert torch.equal(scores, scores.clone())  # the input is untouched
    floats = torch.tensor([0.5, 2.0], dtype=torch.float64)
    assert as_scores(floats) is floats  # floating scores are used as they are


@pytest.mark.parametrize(
    ("scores", "error", "message"),
    [
        ([1.0, 2.0], TypeError, "scores must be a 1-D tensor, got"),
        (torch.zeros(2, dtype=torch.complex64), TypeError, "tensor of real numbers"),
        (torch.zeros(2, 2), ValueError, "scores must be a 1-D tensor"),
        (torch.tensor(1.0), ValueError, "scores must be a 1-D tensor"),
    ],
)
def test_scores_that_are_not_a_1d_real_tensor_are_refused(scores, error, message):
    with pytest.raises(error, match=message):
        as_scores(scores)
    with pytest.raises(error, match=message):
        check_scores(scores)


def test_missing_ids_name_the_selective_backprop_field_and_the_select_argument():
    with pytest.raises(ValueError, match="stale_sb needs sample ids") as error:
        check_ids(None, 3, "stale_sb")
    message = str(error.value)
    assert 'SelectiveBackprop(ids="<field holding each row\'s dataset index>")' in message
    assert "select(..., ids=<int64 Tensor[N]>)" in message
