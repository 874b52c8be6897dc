"""The eager host path of key derivation and small draws: every Threefry block of a draw in one
pass over packed Python ints (``_threefry.host_blocks``) gives the words of the per-element
cipher, and small draws equal the vectorised tensor path bit for bit."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from sbfunc import random as sbrandom
from sbfunc.random import _sampling as sampling
from sbfunc.random import _threefry
from tests.random.helpers import SETTINGS

words = st.integers(0, 2**32 - 1)
EDGE_KEYS = [(0, 0), (2**32 - 1, 2**32 - 1), (2**32 - 1, 0), (0, 2**32 - 1)]


@SETTINGS
@given(k0=words, k1=words, n=st.integers(0, 70))
def test_host_blocks_equal_one_block_per_counter(k0, k1, n):
    assert _threefry.host_blocks(k0, k1, n) == [_threefry.block(k0, k1, 0, i) for i in range(n)]


@pytest.mark.parametrize("key", EDGE_KEYS)
def test_host_blocks_at_the_edge_keys_carry_nothing_between_lanes(key):
    n = 33  # counter + key words overflow 32 bits in some lanes
    assert _threefry.host_blocks(*key, n) == [_threefry.block(*key, 0, i) for i in range(n)]


def test_the_packed_counters_memo_is_bounded():
    for n in range(2, 200):
        _threefry.host_blocks(1, 2, n)
    info = _threefry._packed_counters.cache_info()
    assert info.maxsize is not None and info.currsize <= info.maxsize


@pytest.fixture
def tensor_cipher(monkeypatch):
    """Small draws on the vectorised tensor cipher, as under torch.compile."""
    monkeypatch.setattr(sampling, "host_readable", lambda t: False)


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("n", [1, 2, 7, 8, 33, 128, 129])
def test_small_draws_equal_the_tensor_path(n, monkeypatch):
    key = sbrandom.fold_in(sbrandom.key(11), n)
    host = [sbrandom.bits(key, (n,))] + [sbrandom.uniform(key, (n,), dtype=d) for d in DTYPES]
    host.append(sbrandom.bits(key, (1, n)))
    monkeypatch.setattr(sampling, "host_readable", lambda t: False)
    tensor = [sbrandom.bits(key, (n,))] + [sbrandom.uniform(key, (n,), dtype=d) for d in DTYPES]
    tensor.append(sbrandom.bits(key, (1, n)))
    for a, b in zip(host, tensor, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)
