"""The Threefry-2x32 block cipher, written once over Python ints and int64 tensors.

A 32-bit word is held either as a Python ``int`` or as an ``int64`` tensor whose values lie in
``[0, 2**32)``; every addition is masked back to 32 bits, so int64 never overflows (the largest
intermediate is a 32-bit word shifted left by at most 29 bits). The same :func:`block` therefore
runs on the host for key derivation (tens of microseconds) and as ~150 elementwise tensor ops on
any device (one fused kernel under ``torch.compile``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Union

import torch

__all__ = [
    "MASK",
    "PARITY",
    "ROTATIONS",
    "Word",
    "block",
    "counters",
    "host_block",
    "normalize_shape",
]

Word = Union[int, torch.Tensor]  # noqa: UP007 (a runtime alias: py3.10 `int | Tensor` is fine too)
"""A 32-bit word: a Python int or an int64 tensor of values in ``[0, 2**32)``."""

MASK = 0xFFFFFFFF
PARITY = 0x1BD11BDA  # Threefry's key-schedule constant (Salmon et al. 2011)
ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _rotl(x: Word, r: int) -> Word:
    """``x`` rotated left by ``r`` bits (``x`` below ``2**32``: the right shift needs no mask,
    and one mask after the OR clears what the left shift pushed past 32 bits)."""
    return ((x << r) | (x >> (32 - r))) & MASK


def _same(x: Word) -> Word:
    return x


def _materialize(x: Word) -> Word:
    """An identity view that Inductor lowers by materialising ``x`` (as_strided realizes its
    input); the value still fuses into the same kernel, but Inductor no longer re-inlines the
    whole history of every round into each use, which made compiling one block take ~20 s
    instead of ~3 s on a CPU."""
    return x.as_strided(x.shape, x.stride()) if isinstance(x, torch.Tensor) else x


def block(k0: Word, k1: Word, x0: Word, x1: Word) -> tuple[Word, Word]:
    """Threefry-2x32 with 20 rounds: encrypt the counter ``(x0, x1)`` under the key ``(k0, k1)``.

    Any argument may be a Python int or an int64 tensor (tensors broadcast); the result has the
    type of the arguments (a tensor if any argument is one).
    """
    if type(k0) is int and type(k1) is int and type(x0) is int and type(x1) is int:
        return host_block(k0, k1, x0, x1)
    settle = _materialize if torch.compiler.is_compiling() else _same
    ks = (k0, k1, k0 ^ k1 ^ PARITY)
    x0 = (x0 + ks[0]) & MASK
    x1 = (x1 + ks[1]) & MASK
    for i in range(5):
        for r in ROTATIONS[i % 2]:
            x0 = settle((x0 + x1) & MASK)
            x1 = settle(_rotl(x1, r) ^ x0)
        x0 = (x0 + ks[(i + 1) % 3]) & MASK
        x1 = (x1 + ks[(i + 2) % 3] + (i + 1)) & MASK
    return x0, x1


def host_block(k0: int, k1: int, x0: int, x1: int) -> tuple[int, int]:
    """:func:`block` on Python ints, its rotations inlined: the eager host path (key
    derivation, small draws) calls it per element, and the calls of the generic form cost
    about half its time there. The same words (tested against the tensor form)."""
    ks = (k0, k1, k0 ^ k1 ^ PARITY)
    x0 = (x0 + k0) & MASK
    x1 = (x1 + k1) & MASK
    for i in range(5):
        for r in ROTATIONS[i % 2]:
            x0 = (x0 + x1) & MASK
            x1 = (((x1 << r) & MASK) | (x1 >> (32 - r))) ^ x0
        x0 = (x0 + ks[(i + 1) % 3]) & MASK
        x1 = (x1 + ks[(i + 2) % 3] + i + 1) & MASK
    return x0, x1


def normalize_shape(
    shape: int | Sequence[int] | torch.Size, name: str = "shape"
) -> tuple[int, ...]:
    """``shape`` as a tuple of non-negative ints (an int means a 1-D shape)."""
    dims = (shape,) if isinstance(shape, (int, torch.SymInt)) else shape
    try:
        out = tuple(dims)
    except TypeError:
        out = None
    if out is None or any(
        isinstance(d, bool) or not isinstance(d, (int, torch.SymInt)) for d in out
    ):
        raise TypeError(f"{name} must be an int or a sequence of ints, got {shape!r}")
    if any(isinstance(d, int) and d < 0 for d in out):
        raise ValueError(f"{name} must have non-negative sizes, got {tuple(out)}")
    return out


def counters(shape: tuple[int, ...], device: torch.device) -> tuple[Word, Word]:
    """The 64-bit row-major index of every element of ``shape`` as (high, low) 32-bit words.

    The high word is the int 0 whenever the size fits in 32 bits (it does below 4 G elements),
    which saves a tensor and lets the first rounds fold into constants.
    """
    n = math.prod(shape)
    idx = torch.arange(n, dtype=torch.int64, device=device).reshape(shape)
    if isinstance(n, int) and n <= 1 << 32:
        return 0, idx
    return idx >> 32, idx & MASK
