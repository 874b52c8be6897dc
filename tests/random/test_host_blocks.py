"""The eager host path of key derivation and small draws: every Threefry block of a draw in one
pass over packed Python ints (``_host.host_blocks``) gives the words of the per-element
cipher, and small draws equal the vectorised tensor path bit for bit."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from sbfunc import random as sbrandom
from sbfunc.random import _host, _threefry
from sbfunc.random import _sampling as sampling
from tests.random.helpers import SETTINGS

words = st.integers(0, 2**32 - 1)
EDGE_KEYS = [(0, 0), (2**32 - 1, 2**32 - 1), (2**32 - 1, 0), (0, 2**32 - 1)]


@SETTINGS
@given(k0=words, k1=words, n=st.integers(0, 70))
def test_host_blocks_equal_one_block_per_counter(k0, k1, n):
    assert _host.host_blocks(k0, k1, n) == [_threefry.block(k0, k1, 0, i) for i in range(n)]


@pytest.mark.parametrize("key", EDGE_KEYS)
def test_host_blocks_at_the_edge_keys_carry_nothing_between_lanes(key):
    n = 33  # counter + key words overflow 32 bits in some lanes
    assert _host.host_blocks(*key, n) == [_threefry.block(*key, 0, i) for i in range(n)]


def test_the_packed_counters_memo_is_bounded():
    for n in range(2, 200):
        _host.host_blocks(1, 2, n)
    info = _host._packed_counters.cache_info()
    assert info.maxsize is not None and info.currsize <= info.maxsize


@pytest.fixture
def tensor_cipher(monkeypatch):
    """Small draws on the vectorised tensor cipher, as under torch.compile."""
    monkeypatch.setattr(sampling, "host_readable", lambda t: False)


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("n", [1, 2, 7, 8, 33, 128, 129, 256, 4096, 4097])
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


@SETTINGS
@given(keys=st.lists(st.tuples(words, words), min_size=1, max_size=4), n=st.integers(1, 40))
def test_packed_blocks_of_several_keys_are_each_keys_blocks(keys, n):
    x0, x1 = _host.packed_blocks(keys, n)
    lane = (1 << 64) - 1
    got = [((x0 >> (64 * i)) & lane, (x1 >> (64 * i)) & lane) for i in range(len(keys) * n)]
    assert got == [_threefry.block(k0, k1, 0, i) for k0, k1 in keys for i in range(n)]


@pytest.mark.parametrize("key", EDGE_KEYS)
def test_host_draws_of_several_keys_equal_each_keys_draw(key):
    keys, n = [key, (7, 9)], 33
    bits = _host.host_bits(keys, n)
    unit = _host.host_unit32(keys, n)
    for j, k in enumerate(keys):
        tensor_key = torch.tensor(k, dtype=torch.int64)
        assert torch.equal(bits[j * n : (j + 1) * n], sbrandom.bits(tensor_key, (n,)))
        assert torch.equal(unit[j * n : (j + 1) * n], sbrandom.uniform(tensor_key, (n,)))


def test_host_draws_dispatch_no_operator_but_the_unit_shift():
    from torch.profiler import ProfilerActivity, profile

    key, seven = sbrandom.key(5), torch.tensor(7)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        child = sbrandom.fold_in(sbrandom.fold_in(key, 1), seven)
        sbrandom.bits(child, (64,))
        sbrandom.uniform(child, (64,))
        sbrandom.split(child, 3)
    ops = [e.name for e in prof.events() if e.name.startswith("aten::")]
    # reading the 0-d data; [1, 2) - 1 for the uniform; split's (3, 2) view of its words
    assert ops == ["aten::item", "aten::_local_scalar_dense", "aten::sub_", "aten::view"]


def test_a_remembered_key_changed_in_place_is_read_again():
    key = sbrandom.key(3)
    first = sbrandom.uniform(key, (4,))
    assert _host.host_key_words(key) == (0, 3)
    key.add_(1)  # keys are values; an in-place change is still seen (the version counter)
    assert _host.host_key_words(key) == (1, 4)
    assert not torch.equal(first, sbrandom.uniform(key, (4,)))
    assert torch.equal(sbrandom.uniform(key, (4,)), sbrandom.uniform(torch.tensor([1, 4]), (4,)))


def test_the_words_of_a_batch_of_keys_and_an_inference_key():
    keys = sbrandom.split(sbrandom.key(0), 3)
    assert _host.host_key_words(keys) == tuple(w for row in keys.tolist() for w in row)
    with torch.inference_mode():
        k = sbrandom.key(9)
        assert _host.host_key_words(k) == (0, 9)
        assert torch.equal(sbrandom.bits(k, (3,)), sbrandom.bits(torch.tensor([0, 9]), (3,)))
