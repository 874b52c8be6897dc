import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sbfunc.distributed import balanced_counts, exchange_plan

SETTINGS = settings(max_examples=80, derandomize=True, database=None, deadline=None)


@SETTINGS
@given(kept=st.lists(st.integers(0, 20), min_size=1, max_size=6))
def test_exchange_plans_agree_and_balance(kept):
    world = len(kept)
    plans = [exchange_plan(kept, r) for r in range(world)]
    target = balanced_counts(sum(kept), world)
    for r, plan in enumerate(plans):
        assert sum(plan.send) == kept[r]  # every kept row leaves once (to itself or others)
        assert sum(plan.receive) == target[r]
        for d in range(world):  # what r sends to d is what d receives from r
            assert plan.send[d] == plans[d].receive[r]
    assert max(target) - min(target) <= 1 and sorted(target, reverse=True) == target


@SETTINGS
@given(kept=st.lists(st.integers(0, 20), min_size=1, max_size=6))
def test_exchange_keeps_the_global_order(kept):
    world = len(kept)
    rows = iter(range(sum(kept)))  # the global kept list: rank 0's rows first, then rank 1's...
    owned = [[next(rows) for _ in range(k)] for k in kept]
    received = []
    for d in range(world):
        got = []
        for s in range(world):
            plan = exchange_plan(kept, s)
            start = sum(plan.send[:d])
            got += owned[s][start : start + plan.send[d]]
        received.append(got)
    assert [row for got in received for row in got] == list(range(sum(kept)))


@SETTINGS
@given(total=st.integers(0, 100), world=st.integers(1, 9))
def test_balanced_counts_sum_and_spread(total, world):
    counts = balanced_counts(total, world)
    assert len(counts) == world and sum(counts) == total and max(counts) - min(counts) <= 1


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="world must be an int >= 1, got 0"):
        balanced_counts(3, 0)
    with pytest.raises(ValueError, match="total must be an int >= 0, got -1"):
        balanced_counts(-1, 2)
    with pytest.raises(ValueError, match=r"rank must be an int in \[0, 1\], got 2"):
        exchange_plan([1, 2], 2)
    with pytest.raises(ValueError, match="kept must be a non-empty list of ints >= 0"):
        exchange_plan([1, -2], 0)
