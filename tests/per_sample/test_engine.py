from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sbfunc.per_sample import batch_grad
from sbfunc.per_sample._engine import check_subsampling, check_wrt, resolve_wrt
from tests.per_sample.helpers import setup

SETTINGS = settings(derandomize=True, max_examples=60, deadline=None)


def _outcome(fn):
    try:
        return fn().tolist()
    except (TypeError, ValueError) as err:
        return type(err)


@SETTINGS
@given(values=st.lists(st.integers(-3, 9), max_size=8), n=st.integers(1, 8))
def test_list_and_tensor_indices_are_validated_alike(values, n):
    as_list = _outcome(lambda: check_subsampling(values, n))
    as_tensor = _outcome(lambda: check_subsampling(torch.tensor(values, dtype=torch.long), n))
    as_tuple = _outcome(lambda: check_subsampling(tuple(values), n))
    assert as_list == as_tensor == as_tuple
    valid = bool(values) and min(values) >= 0 and max(values) < n
    assert (as_list == values) == valid  # order and repeats kept


@SETTINGS
@given(
    indices=st.lists(st.integers(0, 5), min_size=1, max_size=6),
    chunk=st.one_of(st.none(), st.integers(1, 6)),
)
def test_the_loss_only_sees_the_selected_rows(indices, chunk):
    """Cost scales with the subset: every forward runs on selected rows only, in chunks."""
    loss_fn, params, buffers, batch = setup("mixed")
    seen = []

    def spy(p, b, x):
        seen.append(x[0].shape[0])
        return loss_fn(p, b, x)

    batch_grad(spy)(params, buffers, batch, subsampling=indices, chunk_size=chunk)
    size = len(indices) if chunk is None else min(chunk, len(indices))
    assert max(seen) == size  # first forward per chunk; vmap's fallback sees batches of one
    full, rest = divmod(len(indices), size)
    chunks = Counter([size] * full + ([rest] if rest else []))
    assert not chunks - Counter(seen)  # every chunk ran its own forward on its rows only


def test_wrt_helpers():
    params = {"a.w": torch.ones(1), "ab.w": torch.ones(1), "a.b.w": torch.ones(1)}
    assert resolve_wrt(["a"], params) == ["a.w", "a.b.w"]  # prefixes stop at dots
    assert resolve_wrt(None, params) == list(params)
    assert check_wrt(None) is None
    with pytest.raises(TypeError, match="wrt"):
        check_wrt(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="wrt"):
        check_wrt([""])
