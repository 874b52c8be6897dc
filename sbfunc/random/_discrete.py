"""Discrete draws from a key: integers in a range, permutations, categorical indices."""

from __future__ import annotations

import math

import torch

from sbfunc.random._keys import Key, check_key, split
from sbfunc.random._sampling import Shape, bits, target_device, uniform
from sbfunc.random._threefry import MASK
from sbfunc.types import Device
from sbfunc.validation import check_int

__all__ = ["categorical", "permutation", "randint"]


def _mul32(a: torch.Tensor, m: int) -> torch.Tensor:
    """``a * m mod 2**32`` for ``a, m < 2**32`` without overflowing int64 (16-bit halves)."""
    return (a * (m & 0xFFFF) + (((a * (m >> 16)) & 0xFFFF) << 16)) & MASK


def randint(k: Key, shape: Shape, low: int, high: int, *, device: Device = None) -> torch.Tensor:
    """Integers in ``[low, high)``, JAX's construction from 64 random bits per value.

    With ``s = high - low``, two 32-bit draws ``h, l`` give ``((h mod s) * (2**32 mod s) +
    l mod s) mod s`` (arithmetic modulo ``2**32``): a bias of order ``s / 2**64`` instead of
    ``s / 2**32``, and bit-identical to ``jax.random.randint`` for int32 bounds.

    Args:
        k: the key.
        shape: the output shape.
        low: the lowest value (included).
        high: the bound (excluded), with ``1 <= high - low <= 2**32``.
        device: where to draw (default: the key's device).

    Returns:
        An ``int64`` tensor of ``shape``.

    Raises:
        TypeError: for a bad key, shape or bound.
        ValueError: if ``high - low`` is outside ``[1, 2**32]``.

    Example:
        >>> sbfunc.random.randint(sbfunc.random.key(0), 8, 0, 10)
        tensor([9, 0, 2, 3, 1, 7, 2, 3])

    References:
        JAX ``jax.random.randint``.
    """
    low = check_int(low, "low")
    high = check_int(high, "high")
    span = high - low
    if not 1 <= span <= 1 << 32:
        raise ValueError(f"high - low must be in [1, 2**32], got low={low}, high={high}")
    k1, k2 = split(k)
    higher = bits(k1, shape, device=device)
    lower = bits(k2, shape, device=device)
    if span == 1 << 32:
        return lower + low
    mult = ((1 << 16) % span) ** 2 % (1 << 32) % span  # JAX's uint32 arithmetic, wrap included
    offset = ((_mul32(higher % span, mult) + lower % span) & MASK) % span
    return offset + low


def permutation(k: Key, n: int, *, device: Device = None) -> torch.Tensor:
    """A uniformly random permutation of ``0 .. n-1``, by sorting on random 32-bit keys.

    ``ceil(3 log n / log(2**32 - 1))`` rounds of a stable sort on fresh keys (one round up to
    n = 1625, two up to about 2.6 million) make key collisions negligible; the rounds are
    static, so the shape and graph are fixed. Equal to ``jax.random.permutation(key, n)``
    (for XLA's sort, up to the order of colliding keys).

    Args:
        k: the key.
        n: the length, ``>= 0``.
        device: where to draw (default: the key's device).

    Returns:
        An ``int64`` tensor of shape ``(n,)``.

    Raises:
        TypeError: for a bad key or ``n``.
        ValueError: if ``n < 0``.

    Example:
        >>> sbfunc.random.permutation(sbfunc.random.key(0), 10)
        tensor([0, 1, 8, 5, 6, 4, 3, 2, 7, 9])

    References:
        JAX ``jax.random.permutation`` (the sort-based shuffle of TensorFlow's random ops).
    """
    n = check_int(n, "n", low=0)
    check_key(k, "k")
    dev = target_device(k, device)
    out = torch.arange(n, device=dev)
    for _ in range(math.ceil(3 * math.log(max(1, n)) / math.log(MASK))):
        k, sub = split(k)
        out = out[torch.argsort(bits(sub, n, device=dev), stable=True)]
    return out


def categorical(k: Key, probs: torch.Tensor, num_samples: int) -> torch.Tensor:
    """Draw indices with replacement, with probabilities proportional to ``probs``.

    Inverse CDF: ``searchsorted(cumsum(probs), U * sum(probs))``, one uniform per draw; the
    output shape is static and zero-weight entries are never drawn.

    Args:
        k: the key.
        probs: ``Tensor[N]`` of non-negative weights with a positive sum (not checked: no
            sync); need not be normalised.
        num_samples: how many draws, ``>= 0``.

    Returns:
        An ``int64`` tensor of shape ``(num_samples,)`` on ``probs``'s device.

    Raises:
        TypeError: for a bad key, ``probs`` or ``num_samples``.
        ValueError: if ``probs`` is not a non-empty 1-D tensor or ``num_samples < 0``.

    Example:
        >>> sbfunc.random.categorical(sbfunc.random.key(0), torch.tensor([0.0, 1.0, 3.0]), 5)
        tensor([2, 2, 2, 2, 2])

    References:
        Devroye 1986, "Non-Uniform Random Variate Generation", ch. III.2 (inversion);
        PyTorch ``torch.multinomial(..., replacement=True)``.
    """
    if not isinstance(probs, torch.Tensor) or not probs.dtype.is_floating_point:
        raise TypeError(f"probs must be a floating-point tensor, got {probs!r}")
    if probs.dim() != 1 or probs.shape[0] < 1:
        raise ValueError(f"probs must be a non-empty 1-D tensor, got shape {tuple(probs.shape)}")
    num_samples = check_int(num_samples, "num_samples", low=0)
    cdf = torch.cumsum(probs, 0)
    u = uniform(k, num_samples, dtype=cdf.dtype, device=probs.device) * cdf[-1]
    return torch.searchsorted(cdf, u, right=True).clamp_max(probs.shape[0] - 1)
