import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc import random as sbrandom

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
    for r in (sbfunc.ranks(s), sbfunc.ranks(s, key=sbrandom.key(seed))):
        assert torch.equal(torch.sort(r).values, torch.arange(len(xs)))
        less = s[:, None] < s[None, :]
        assert bool((r[:, None] < r[None, :])[less].all())


def test_negative_zero_ties_with_zero():
    s = torch.tensor([0.0, -0.0])
    seen = {tuple(sbfunc.ranks(s, key=sbrandom.key(i)).tolist()) for i in range(40)}
    assert seen == {(0, 1), (1, 0)}
