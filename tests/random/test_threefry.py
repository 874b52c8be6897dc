import torch
from hypothesis import given
from hypothesis import strategies as st

from sbfunc.random import _threefry
from tests.random.helpers import SETTINGS

words = st.integers(0, 2**32 - 1)

# Random123's known-answer vectors for Threefry-2x32 with 20 rounds: (key, counter) -> output.
KAT = [
    ((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
]


def test_known_answers_on_python_ints():
    for key, ctr, out in KAT:
        assert _threefry.block(*key, *ctr) == out


def test_known_answers_on_tensors_vectorised():
    k0, k1 = (torch.tensor([kat[0][i] for kat in KAT]) for i in range(2))
    x0, x1 = (torch.tensor([kat[1][i] for kat in KAT]) for i in range(2))
    y0, y1 = _threefry.block(k0, k1, x0, x1)
    assert y0.dtype == torch.int64
    assert [(a, b) for a, b in zip(y0.tolist(), y1.tolist(), strict=True)] == [k[2] for k in KAT]


@SETTINGS
@given(words, words, words, words)
def test_int_and_tensor_blocks_agree(k0, k1, x0, x1):
    expected = _threefry.block(k0, k1, x0, x1)
    as_tensors = _threefry.block(*(torch.tensor(v) for v in (k0, k1, x0, x1)))
    mixed = _threefry.block(k0, k1, torch.tensor([x0]), x1)
    assert tuple(int(v) for v in as_tensors) == expected
    assert tuple(int(v) for v in mixed) == expected
    assert all(0 <= v < 2**32 for v in expected)


def test_counters_are_the_row_major_index():
    hi, lo = _threefry.counters((2, 3), torch.device("cpu"))
    assert hi == 0
    assert torch.equal(lo, torch.arange(6).reshape(2, 3))
