"""The step's gradient helpers: the non-finite check agrees with a plain one and leaves the
gradients as they were, bit for bit."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sbfunc._finite import known_finite
from sbfunc._finite import update_finite as all_finite
from tests.helpers import assert_identical

VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.sampled_from([0.0, -0.0, 1e-45, -1e-45, 3.4e38]),  # signed zeros, subnormals, max
)
DTYPES = st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16])


@st.composite
def gradients(draw):
    names = draw(st.lists(st.sampled_from("abcde"), unique=True, max_size=4))
    return {
        k: torch.tensor(draw(st.lists(VALUES, min_size=0, max_size=6)), dtype=draw(DTYPES))
        for k in names
    }


@settings(max_examples=150, derandomize=True, database=None, deadline=None)
@given(gradients(), VALUES)
def test_all_finite_agrees_with_a_plain_check_and_changes_nothing(grads, loss):
    before = {k: v.clone() for k, v in grads.items()}
    expected = math.isfinite(loss) and all(bool(g.isfinite().all()) for g in grads.values())
    got = all_finite(torch.tensor(loss), grads)
    assert got.dtype == torch.bool and got.shape == ()
    assert bool(got) == expected
    assert_identical(grads, before)


BAD = [0.0, math.nan, math.inf, -math.inf]


@settings(max_examples=40, derandomize=True, database=None, deadline=None)
@given(
    scores=st.lists(st.sampled_from([1.0, 2.0, *BAD]), min_size=1, max_size=8),
    inputs=st.lists(st.sampled_from([1.0, *BAD]), min_size=8, max_size=8),
    structure=st.sampled_from(["tuple", "dict", "nested"]),
)
def test_known_finite_only_when_every_score_and_row_is_finite(scores, inputs, structure):
    """What Selective Backprop reads to skip counting the unscorable rows (issue 42 moved it
    here from ``sbfunc/selective_backprop/_apply.py``): a nested batch and a spec are counted."""
    n = len(scores)
    s, x = torch.tensor(scores), torch.tensor(inputs[:n]).reshape(n, 1)
    y = torch.arange(n)
    batch = {"tuple": (x, y), "dict": {"x": x, "y": y}, "nested": ((x,), y)}[structure]
    finite = bool(torch.isfinite(s).all() and torch.isfinite(x).all())
    assert known_finite(s, batch) == (structure != "nested" and finite)
    assert not known_finite(s, batch, per_sample=True)  # a spec: the exact count
