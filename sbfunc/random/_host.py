"""The eager host path of the cipher: many Threefry blocks at once on packed Python ints, their
words handed to torch without a tensor op, and the words of the keys made here remembered.

On a CPU key in eager code, key derivation and small draws never need tensor arithmetic: the
cipher runs once over a Python int that packs every counter (and every key) in its own 64-bit
lane (SIMD within a register), and the result becomes a tensor through ``torch.frombuffer``,
which dispatches no operator. A key made here is remembered with its words, so deriving from
it or drawing under it reads no tensor either. Every word equals :func:`~._threefry.block`'s
(tested against the tensor form).
"""

from __future__ import annotations

import array
import functools
import sys
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from sbfunc._tracing import host_readable
from sbfunc.random._threefry import MASK, PARITY, ROTATIONS, Word, host_block

__all__ = [
    "host_bits",
    "host_blocks",
    "host_key",
    "host_key_words",
    "host_unit32",
    "packed_blocks",
    "words",
]

_LANE = 64  # bits per lane: a 32-bit word and room for carries
_LITTLE = sys.byteorder == "little"  # frombuffer reads native lanes: little-endian packing


@functools.lru_cache(maxsize=64)
def _packed_counters(n: int, m: int = 1) -> tuple[int, int, int]:
    """``(ones, index, unit)``: 1 in each of ``m * n`` lanes, lane ``j * n + i`` holding ``i``,
    and 1 in each of the first ``n`` lanes (three ints, made from their bytes in linear
    time)."""
    index = array.array("Q", range(n))
    if not _LITTLE:
        index.byteswap()
    unit = int.from_bytes((b"\x01" + bytes(7)) * n, "little")
    return (
        int.from_bytes((b"\x01" + bytes(7)) * (n * m), "little"),
        int.from_bytes(index.tobytes() * m, "little"),
        unit,
    )


def packed_blocks(keys: Sequence[tuple[int, int]], n: int) -> tuple[int, int]:
    """The words of the block of counter ``(0, i)`` under key ``j``, for every key and ``i <
    n``, in one pass: lane ``j * n + i`` of the two returned ints holds its two words. Every
    lane sum stays below ``2**34`` and every shifted word below ``2**61``, so no lane spills
    into the next, and each lane's words are exactly :func:`~._threefry.block`'s.
    """
    ones, index, unit = _packed_counters(n, len(keys))
    span = _LANE * n
    ks0 = ks1 = 0
    for j, (k0, k1) in enumerate(keys):
        ks0 |= (k0 * unit) << (span * j)
        ks1 |= (k1 * unit) << (span * j)
    mask = MASK * ones
    ks = (ks0, ks1, ks0 ^ ks1 ^ (PARITY * ones))
    x0 = ks0
    x1 = (index + ks1) & mask
    for i in range(5):
        for r in ROTATIONS[i % 2]:
            x0 = (x0 + x1) & mask
            x1 = (((x1 << r) | (x1 >> (32 - r))) & mask) ^ x0
        x0 = (x0 + ks[(i + 1) % 3]) & mask
        x1 = (x1 + ks[(i + 2) % 3] + (i + 1) * ones) & mask
    return x0, x1


def host_blocks(k0: int, k1: int, n: int) -> list[tuple[int, int]]:
    """:func:`~._threefry.block` under the key ``(k0, k1)`` of the counters ``(0, i)`` for
    ``i < n``, all ``n`` at once (:func:`packed_blocks`): a batch's worth of draws costs about
    two blocks instead of ``n``.

    Example:
        >>> host_blocks(0, 42, 2) == [host_block(0, 42, 0, 0), host_block(0, 42, 0, 1)]
        True
    """
    if n <= 1:
        return [host_block(k0, k1, 0, 0)] if n == 1 else []
    x0, x1 = packed_blocks(((k0, k1),), n)
    return list(zip(_lanes(x0, n), _lanes(x1, n), strict=True))


def _lanes(packed: int, n: int) -> array.array[int]:
    """The ``n`` 64-bit lanes of ``packed``, lowest lane first."""
    out = array.array("Q", packed.to_bytes(n * _LANE // 8, "little"))
    if not _LITTLE:
        out.byteswap()
    return out


def host_bits(keys: Sequence[tuple[int, int]], n: int) -> torch.Tensor | None:
    """``Tensor[len(keys) * n]`` of int64: the XOR of the two words of each block of
    :func:`packed_blocks` (``sbfunc.random.bits`` of each key, concatenated), made without a
    tensor op; ``None`` on a big-endian host."""
    if not _LITTLE:
        return None
    x0, x1 = packed_blocks(keys, n)
    lanes = len(keys) * n
    return torch.frombuffer(bytearray((x0 ^ x1).to_bytes(lanes * 8, "little")), dtype=torch.int64)


_FLOAT32_ONE = 0x3F800000  # the bits of 1.0 in float32: OR-ing 23 mantissa bits gives [1, 2)
_ONE = torch.ones(())  # a tensor operand dispatches one op where a Python 1.0 dispatches five


def host_unit32(keys: Sequence[tuple[int, int]], n: int) -> torch.Tensor | None:
    """``Tensor[len(keys) * n]`` of float32 uniform in ``[0, 1)``: ``sbfunc.random.uniform``
    of each key, concatenated. The top 23 bits of each block's XOR are placed in the mantissa
    of a float in ``[1, 2)`` and 1 is subtracted, which is exact, so each value is ``j *
    2**-23`` as the tensor path makes it (one tensor op); ``None`` on a big-endian host."""
    if not _LITTLE:
        return None
    x0, x1 = packed_blocks(keys, n)
    lanes = len(keys) * n
    ones = _packed_counters(lanes)[2]
    mantissa = ((x0 ^ x1) >> 9) & ((1 << 23) - 1) * ones
    raw = memoryview((mantissa | _FLOAT32_ONE * ones).to_bytes(lanes * 8, "little"))
    low = bytearray(raw.cast("I")[::2].tobytes())  # the low 32 bits of every lane
    return torch.frombuffer(low, dtype=torch.float32).sub_(_ONE)


# --- keys made on the host, remembered with their words -------------------------------------

_KNOWN: dict[int, tuple[Any, int, tuple[int, ...]]] = {}  # id -> (weak ref, version, words)
_KNOWN_MAX = 256


def host_key(words: Sequence[int], shape: tuple[int, ...] = (2,)) -> torch.Tensor:
    """A CPU key (or ``shape`` of keys) holding ``words`` (each in ``[0, 2**32)``), made by
    ``torch.frombuffer`` (no tensor op) and remembered, so :func:`host_key_words` of it reads
    no tensor."""
    t = torch.frombuffer(array.array("q", words), dtype=torch.int64)
    if shape != (len(words),):
        t = t.view(shape)
    _remember(t, tuple(words))
    return t


def _remember(t: torch.Tensor, words: tuple[int, ...]) -> None:
    if t.is_inference():  # no version counter to tell an in-place change
        return
    if len(_KNOWN) >= _KNOWN_MAX:
        _KNOWN.clear()
    _KNOWN[id(t)] = (weakref.ref(t), t._version, words)


def host_key_words(k: torch.Tensor) -> tuple[int, ...]:
    """The words of key ``k`` (or of every key of a batch of keys, flattened) as Python ints
    (the caller checked ``host_readable``). A key made by :func:`host_key`, and one read
    before, is not read again while unchanged (same object, same version counter)."""
    entry = _KNOWN.get(id(k))
    if entry is not None and entry[0]() is k and k._version == entry[1]:
        return entry[2]
    values = k.tolist()
    flat = values if k.dim() == 1 else [w for row in values for w in row]
    found = tuple(w & MASK for w in flat)
    _remember(k, found)
    return found


def words(k: torch.Tensor, device: torch.device | None = None) -> tuple[Word, Word]:
    """The two words of key ``k``: Python ints when ``host_readable``, else int64 tensors on
    ``device`` (default: the key's device)."""
    if host_readable(k):
        w0, w1 = host_key_words(k)
        return w0, w1
    if device is not None and k.device != device:
        k = k.to(device)
    return k[0], k[1]
