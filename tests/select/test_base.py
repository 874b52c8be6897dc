import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sbfunc import random as sbrandom
from sbfunc.select import kept_count, nonfinite_lowest, ranks

values = st.lists(
    st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.5, -2.5, 1e-30, -1e30, float("inf"), -float("inf")])
    | st.floats(-1e6, 1e6, allow_nan=False),
    min_size=1,
    max_size=40,
)


@settings(max_examples=80, deadline=None, derandomize=True, database=None)
@given(values, st.integers(0, 2**32), st.sampled_from([torch.float32, torch.float64]))
def test_ranks_are_a_permutation_that_respects_order(xs, seed, dtype):
    s = torch.tensor(xs, dtype=dtype)
    for r in (ranks(s), ranks(s, key=sbrandom.key(seed))):
        assert torch.equal(torch.sort(r).values, torch.arange(len(xs)))
        low = nonfinite_lowest(s)  # every non-finite score ranks below every finite one
        less = low[:, None] < low[None, :]
        assert bool((r[:, None] < r[None, :])[less].all())


def test_negative_zero_ties_with_zero():
    s = torch.tensor([0.0, -0.0])
    seen = {tuple(ranks(s, key=sbrandom.key(i)).tolist()) for i in range(40)}
    assert seen == {(0, 1), (1, 0)}


common = settings(max_examples=60, deadline=None, derandomize=True, database=None)


@common
@given(st.integers(1, 10_000), st.integers(1, 100))
def test_kept_count_exact_decimal(n, percent):
    keep = percent / 100
    assert kept_count(n, keep) == max(1, (n * percent) // 100)


@common
@given(st.integers(1, 10_000), st.integers(1, 1000))
def test_kept_count_exact_three_digit_decimal(n, permille):
    keep = permille / 1000
    assert kept_count(n, keep) == max(1, (n * permille) // 1000)


def test_kept_count_examples():
    assert kept_count(100, 0.29) == 29  # int(0.29 * 100) == 28
    assert kept_count(1, 0.5) == 1  # Composer returns an empty batch
    assert kept_count(10, 1.0) == 10


@pytest.mark.parametrize(("n", "error"), [(-1, ValueError), (2.0, TypeError), (True, TypeError)])
def test_kept_count_n(n, error):
    with pytest.raises(error, match="n \\(the batch size\\)"):
        kept_count(n, 0.5)


def test_kept_count_of_an_empty_batch_is_zero():
    assert kept_count(0, 0.5) == 0 and kept_count(0, 1.0) == 0


def test_ranks_without_key_is_stable():
    assert ranks(torch.tensor([1.0, 1.0, 0.0])).tolist() == [1, 2, 0]


def test_nonfinite_lowest_maps_every_non_finite_score_to_minus_inf():
    s = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), -2.0])
    assert nonfinite_lowest(s).tolist() == [1.0, -float("inf"), -float("inf"), -float("inf"), -2.0]
    assert torch.equal(nonfinite_lowest(torch.tensor([3, 1])), torch.tensor([3, 1]))
