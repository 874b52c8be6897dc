"""The step's gradient helpers: the non-finite check agrees with a plain one and leaves the
gradients as they were, bit for bit."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

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
