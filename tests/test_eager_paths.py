"""The eager shortcuts of the selection path change no bit: the host path (CPU, nothing
tracing; it reads whether every score is finite and skips the selects that place non-finite
rows) and the device path (no host read) give the selections of the formulas written out
in full, and ``finite_entries`` is ``torch.isfinite``."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sbfunc import random as sbrandom
from sbfunc._finite import finite_entries
from sbfunc.policies import _rank_power as rank_power
from sbfunc.random import _host as random_host
from sbfunc.random import _keys as random_keys
from sbfunc.random import _sampling as random_sampling
from sbfunc.select import _base as base
from sbfunc.select import _samplers as samplers

NAN, INF = float("nan"), float("inf")
SETTINGS = settings(max_examples=30, derandomize=True, database=None, deadline=None)
values = st.one_of(st.floats(-5, 5, width=32), st.sampled_from([NAN, INF, -INF, 0.0, -0.0, 1e-45]))
score_lists = st.lists(values, min_size=1, max_size=40)
KEEPS = [0.1, 0.25, 0.5, 1.0, 1e-37]  # 1e-37: log-weights that are -inf themselves
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def _isfinite_lowest(s: torch.Tensor) -> torch.Tensor:
    return torch.where(s.isfinite(), s, -torch.inf) if s.dtype.is_floating_point else s


def _reference_rank_power(s: torch.Tensor, keep: float, tie: torch.Tensor, u: torch.Tensor):
    """rank_power_indices as written before the eager shortcuts (sbfunc 1.0)."""
    n, k = s.shape[0], base.kept_count(s.shape[0], keep)
    position = torch.arange(n)
    order = base.ascending_order(_isfinite_lowest(s), tie)
    log_w = rank_power.rank_power_log_weights(position, keep)
    count = (~s.isfinite()).sum() if s.dtype.is_floating_point else 0
    log_w = torch.where(position < count, -torch.inf, log_w)
    g = sbrandom.gumbel_from_uniform(u)
    drawn, ok = log_w + g, log_w.isfinite()
    lowest = torch.where(ok, drawn, torch.inf).amin()
    lowest = torch.where(ok.any(), lowest, 0.0)
    keys = torch.where(ok, drawn, lowest - 1.0 - (g.amax() - g))
    return torch.sort(order[torch.topk(keys, k, sorted=False).indices]).values


def _reference_top_k(s: torch.Tensor, k: int, tie: torch.Tensor) -> torch.Tensor:
    n = s.shape[0]
    order = base.ascending_order(_isfinite_lowest(-s), tie)
    count = (~s.isfinite()).sum() if s.dtype.is_floating_point else 0
    return torch.sort(order[(torch.arange(n) + count) % max(n, 1)][:k]).values


PATHS = ["host", "device"]


@contextlib.contextmanager
def on_path(path: str) -> Iterator[None]:
    """The eager host path, or the path a device takes (no host read)."""
    with pytest.MonkeyPatch.context() as mp:
        if path == "device":
            mp.setattr(base, "host_readable", lambda t: False)
            mp.setattr(samplers, "host_readable", lambda t: False)
            mp.setattr(rank_power, "host_readable", lambda t: False)
        yield


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("keep", KEEPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@SETTINGS
@given(scores=score_lists, seed=st.integers(0, 2**16))
def test_rank_power_and_top_k_indices_equal_the_full_formulas(path, keep, dtype, scores, seed):
    s = torch.tensor(scores).to(dtype)
    n = s.shape[0]
    key = sbrandom.key(seed)
    tie, u = sbrandom.bits(key, (n,)), sbrandom.uniform(sbrandom.fold_in(key, 1), (n,))
    k = base.kept_count(n, keep)
    masked = torch.where(s.isfinite(), u, u - 1.0)
    expected = torch.sort(torch.topk(masked, k, sorted=False).indices).values
    with on_path(path):
        got = rank_power.rank_power_indices(s, keep, tie, u)
        top, rand = samplers.top_k_indices(s, k, tie), samplers.random_indices(s, k, u)
    assert torch.equal(got, _reference_rank_power(s, keep, tie, u))
    assert torch.equal(top, _reference_top_k(s, k, tie))
    assert torch.equal(rand, expected)


@SETTINGS
@given(scores=score_lists)
def test_finite_entries_is_isfinite(scores):
    for dtype in DTYPES:
        s = torch.tensor(scores).to(dtype)
        assert torch.equal(finite_entries(s), s.isfinite())
    ints = torch.arange(len(scores))
    assert torch.equal(finite_entries(ints), ints.isfinite())


@pytest.mark.parametrize("path", PATHS)
def test_finite_split_names_the_non_finite_scores_once(path):
    s = torch.tensor([1.0, NAN, -INF, 2.0, INF])
    clean = torch.tensor([3.0, -1.0])
    with on_path(path):
        lowest, count = base.finite_split(s)
        assert torch.equal(lowest, torch.tensor([1.0, -INF, -INF, 2.0, -INF]))
        assert int(count) == 3
        lowest, count = base.finite_split(clean)
    assert torch.equal(lowest, clean) and int(count) == 0
    assert isinstance(count, int) == (path == "host")  # the host read decides eagerly
    ints = torch.tensor([2, 1])
    assert base.finite_split(ints)[0] is ints and base.finite_split(ints)[1] == 0


@SETTINGS
@given(st.lists(st.integers(0, 63), min_size=1, max_size=64, unique=True))
def test_sorted_unique_sorts_eagerly_as_the_compiled_mask_does(indices):
    idx = torch.tensor(indices)
    eager = samplers.sorted_unique(idx, 64)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.compiler, "is_compiling", lambda: True)
        masked = samplers.sorted_unique(idx, 64)
    assert eager.dtype == masked.dtype == torch.int64
    assert torch.equal(eager, masked)


def test_the_log_weights_memo_is_bounded_and_equal_to_fresh_ones():
    for n in range(1, 60):
        cached = rank_power._host_log_weights(n, 0.5)
        assert torch.equal(cached, rank_power.rank_power_log_weights(torch.arange(n), 0.5))
    info = rank_power._host_log_weights.cache_info()
    assert info.maxsize is not None and info.currsize <= info.maxsize


@SETTINGS
@given(scores=score_lists)
def test_distinct_order_is_the_order_where_no_tie_can_arise(scores):
    for dtype in DTYPES:
        s = torch.tensor(scores).to(dtype)
        got = base.distinct_order(s)
        values = s.tolist()
        distinct = len(set(values)) == len(values)  # (-0.0 == 0.0: a tie)
        if not (distinct and all(map(math.isfinite, values))):
            assert got is None
            continue
        assert got is not None and torch.equal(got, torch.argsort(s, stable=True))
        tie = sbrandom.bits(sbrandom.key(len(values)), (len(values),))
        assert torch.equal(got, base.ascending_order(s, tie))  # the noise changes nothing
    with on_path("device"):
        assert base.distinct_order(torch.tensor([1.0, 2.0])) is None


ties = st.lists(st.sampled_from([0.5, 1.0, NAN, -0.0, 0.0, 2.0]), min_size=1, max_size=12)


@pytest.mark.parametrize("keep", [0.25, 0.5, 1.0])
@SETTINGS
@given(scores=st.one_of(score_lists, ties), seed=st.integers(0, 2**16))
def test_the_rank_power_policy_selects_as_on_a_device(keep, scores, seed):
    s, key = torch.tensor(scores), sbrandom.key(seed)
    policy = rank_power.rank_power(keep)
    host = policy.select(s, policy.init(), key=key)[0].indices
    with on_path("device"), pytest.MonkeyPatch.context() as mp:
        for module in (random_host, random_keys, random_sampling):  # the tensor cipher
            mp.setattr(module, "host_readable", lambda t: False)
        device = policy.select(s, policy.init(), key=key)[0].indices
    tie_key, draw_key = sbrandom.split(key)  # the 1.0 draws, written out
    n = s.shape[0]
    tie, u = sbrandom.bits(tie_key, (n,)), sbrandom.uniform(draw_key, (n,))
    assert torch.equal(host, device)
    assert torch.equal(host, _reference_rank_power(s, keep, tie, u))
