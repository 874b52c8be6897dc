"""Noise from a key: bits, uniform, normal, Gumbel and Bernoulli draws.

Every sampler encrypts the row-major index of each output element under the key (Threefry-2x32,
one block per element, vectorised over the counters), so the values depend only on the key, the
shape and the element's position, never on the device, and everything traces under
``torch.compile(fullgraph=True)`` with static shapes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from sbfunc._tracing import host_readable
from sbfunc.random._host import host_bits, host_blocks, host_key_words, host_unit32, words
from sbfunc.random._keys import Key, check_key
from sbfunc.random._threefry import Word, block, counters, normalize_shape
from sbfunc.types import Device
from sbfunc.validation import check_fraction, check_real

__all__ = ["bernoulli", "bits", "gumbel", "gumbel_from_uniform", "normal", "uniform"]

Shape = int | Sequence[int] | torch.Size

_WIDER = {
    torch.float16: torch.float32,
    torch.bfloat16: torch.float32,
    torch.float32: torch.float64,
}


def target_device(k: Key, device: Device) -> torch.device:
    """``device`` if given, else the key's device."""
    return k.device if device is None else torch.device(device)


def check_float_dtype(dtype: torch.dtype) -> torch.dtype:
    """``dtype`` if it is a floating-point dtype, else a ``TypeError``."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    return dtype


_HOST_BLOCKS_MAX = 4096  # up to this many elements, packed Python-int blocks beat ~150 tensor ops


def _host_words(k: Key, dims: tuple[int, ...], device: torch.device) -> tuple[int, int] | None:
    """The key's words, for a draw that the host path makes: eagerly on the CPU, of at most
    ``_HOST_BLOCKS_MAX`` elements (a batch's worth of tie noise or Gumbel noise), every block
    in one pass over packed Python ints (:mod:`~sbfunc.random._host`, ~40 us for 256)
    instead of the ~0.4 ms of the vectorised cipher's ~150 small tensor ops; the words are the
    same. ``None`` when the draw is large, on an accelerator or traced."""
    n = math.prod(dims)
    if not (isinstance(n, int) and 0 < n <= _HOST_BLOCKS_MAX and device.type == "cpu"):
        return None
    if not host_readable(k):
        return None
    w0, w1 = host_key_words(k)
    return w0, w1


def _shaped(flat: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    return flat if len(dims) == 1 else flat.reshape(dims)


def _blocks(
    k: Key, dims: tuple[int, ...], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both output words of the block for every element of ``dims`` (int64 tensors, the
    vectorised cipher: the callers take :func:`_host_words` first where it applies)."""
    hi, lo = counters(dims, device)
    w0, w1 = words(k, device)
    y0, y1 = block(w0, w1, hi, lo)
    return torch.as_tensor(y0), torch.as_tensor(y1)


def bits(k: Key, shape: Shape, *, device: Device = None) -> torch.Tensor:
    """Uniform random 32-bit words, as ``int64`` values in ``[0, 2**32)``.

    Element ``i`` (row-major) is the XOR of the two output words of Threefry-2x32 on the
    counter ``(i >> 32, i)``: bit-identical to ``jax.random.bits(key, shape)`` (uint32).

    Args:
        k: the key.
        shape: the output shape (an int means 1-D).
        device: where to draw (default: the key's device).

    Returns:
        An ``int64`` tensor of ``shape``.

    Raises:
        TypeError: if ``k`` is not a key or ``shape`` not a shape.
        ValueError: if ``shape`` has a negative size.

    Example:
        >>> sbfunc.random.bits(sbfunc.random.key(0), 3)
        tensor([4070199207, 4202968722, 1427181096])

    References:
        JAX ``jax.random.bits`` (``jax_threefry_partitionable=True``); Salmon et al. 2011,
        "Parallel Random Numbers: As Easy as 1, 2, 3".
    """
    dev, dims = target_device(k, device), normalize_shape(shape)
    w = _host_words(check_key(k, "k"), dims, dev)
    out = None if w is None else host_bits((w,), math.prod(dims))
    if out is not None:  # the XOR on the host too: no tensor op
        return _shaped(out, dims)
    y0, y1 = _blocks(k, dims, dev)
    return y0 ^ y1


def _mantissa_bits(dtype: torch.dtype) -> int:
    """The explicit mantissa bits of a floating dtype (23 for float32)."""
    return round(-math.log2(torch.finfo(check_float_dtype(dtype)).eps))


def _round(x: float, mant: int) -> float:
    """``x`` rounded to nearest-even with ``mant`` explicit mantissa bits (range not checked)."""
    m, e = math.frexp(x)
    return math.ldexp(round(m * 2.0 ** (mant + 1)), e - mant - 1)


def _unit(k: Key, shape: Shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Uniform in ``[0, 1)`` on the grid ``j * 2**-m`` (``m`` = the dtype's mantissa bits)."""
    info = torch.finfo(check_float_dtype(dtype))
    mant = _mantissa_bits(dtype)
    dims = normalize_shape(shape)
    w = _host_words(check_key(k, "k"), dims, device)
    if w is not None:  # the same arithmetic on Python ints; every value is exact
        n = math.prod(dims)
        out = host_unit32((w,), n) if dtype == torch.float32 else None
        if out is not None:
            return _shaped(out, dims)
        rows = host_blocks(*w, n)
        values = [_grid(y0, y1, info.bits, mant) * 2.0**-mant for y0, y1 in rows]
        return torch.tensor(values, dtype=dtype).reshape(dims)
    y0, y1 = _blocks(k, dims, device)
    grid = _grid(y0, y1, info.bits, mant)
    assert isinstance(grid, torch.Tensor)
    return grid.to(dtype) * 2.0**-mant


def _grid(y0: Word, y1: Word, bits: int, mant: int) -> Word:
    """The top ``mant`` random bits of a block as an integer in ``[0, 2**mant)``."""
    if bits == 64:
        return (y0 << (mant - 32)) | (y1 >> (64 - mant))  # the top `mant` of the 64 bits
    width = 8 if mant < 8 else bits  # JAX draws at least 8 bits
    word = y0 ^ y1
    if width < 32:
        word = word & ((1 << width) - 1)
    return word >> (width - mant)


def uniform(
    k: Key,
    shape: Shape,
    *,
    dtype: torch.dtype = torch.float32,
    minval: float = 0.0,
    maxval: float = 1.0,
    device: Device = None,
) -> torch.Tensor:
    """Uniform noise in ``[minval, maxval)``.

    The unit draw puts the top mantissa-many random bits on the grid ``j * 2**-m`` (``m`` = 23
    for float32, 52 for float64 from both words of the block), so it is exact, never 1.0, and
    bit-identical to ``jax.random.uniform``. The affine map to ``[minval, maxval)`` rounds
    ``u * (maxval - minval) + minval`` once (JAX's fused multiply-add, emulated in a wider
    dtype so that eager, compiled and every device agree) and is clamped below ``maxval``.

    Args:
        k: the key.
        shape: the output shape.
        dtype: a floating-point dtype.
        minval: the lower bound (included).
        maxval: the upper bound (excluded), ``> minval``.
        device: where to draw (default: the key's device).

    Returns:
        A tensor of ``shape`` and ``dtype``.

    Raises:
        TypeError: for a bad key, shape, dtype or bound.
        ValueError: for a non-finite bound, or ``maxval <= minval`` once both are rounded to
            ``dtype``.

    Example:
        >>> sbfunc.random.uniform(sbfunc.random.key(0), 3)
        tensor([0.9477, 0.9786, 0.3323])

    References:
        JAX ``jax.random.uniform`` (the mantissa construction).
    """
    dev = target_device(k, device)
    if type(minval) is float and type(maxval) is float and (minval, maxval) == (0.0, 1.0):
        return _unit(k, shape, dtype, dev)  # the unit draw itself (no bound to check)
    lo, hi = check_real(minval, "minval"), check_real(maxval, "maxval")
    mant = _mantissa_bits(dtype)
    if _round(hi, mant) <= _round(lo, mant):
        raise ValueError(
            f"maxval must be > minval in {dtype}, got minval={lo}, maxval={hi} (an empty range)"
        )
    u = _unit(k, shape, dtype, dev)
    if lo == 0.0 and hi == 1.0:
        return u
    lo_t = torch.full((), lo, dtype=dtype, device=dev)
    hi_t = torch.full((), hi, dtype=dtype, device=dev)
    # u * span is exact in the wider dtype, so the sum is rounded once, like JAX's fused
    # multiply-add, whether or not a compiler contracts it (MPS has no float64).
    wide = _WIDER.get(dtype, dtype) if dev.type != "mps" else dtype
    out = (u.to(wide) * (hi_t - lo_t).to(wide) + lo_t.to(wide)).to(dtype)
    return out.clamp(lo_t, torch.nextafter(hi_t, lo_t))


def normal(
    k: Key, shape: Shape, *, dtype: torch.dtype = torch.float32, device: Device = None
) -> torch.Tensor:
    """Standard normal noise, ``sqrt(2) * erfinv(U)`` with ``U`` uniform in ``(-1, 1)``.

    The inverse-CDF transform uses one uniform per sample (as JAX does; equal to
    ``jax.random.normal`` up to the last bits of ``erfinv``) and is finite everywhere.

    Args:
        k: the key.
        shape: the output shape.
        dtype: a floating-point dtype.
        device: where to draw (default: the key's device).

    Returns:
        A tensor of ``shape`` and ``dtype``.

    Raises:
        TypeError: for a bad key, shape or dtype.

    Example:
        >>> sbfunc.random.normal(sbfunc.random.key(0), 2)
        tensor([1.6226, 2.0253])

    References:
        JAX ``jax.random.normal``; Giles 2010, "Approximating the erfinv function".
    """
    lo = -1.0 + 2.0 ** -(_mantissa_bits(dtype) + 1)  # the float just above -1 in dtype
    u = uniform(k, shape, dtype=dtype, minval=lo, maxval=1.0, device=device)
    return torch.erfinv(u) * math.sqrt(2.0)


def gumbel(
    k: Key, shape: Shape, *, dtype: torch.dtype = torch.float32, device: Device = None
) -> torch.Tensor:
    """Standard Gumbel noise ``-log(-log(U))`` (bit-identical construction to JAX's).

    Args:
        k: the key.
        shape: the output shape.
        dtype: a floating-point dtype.
        device: where to draw (default: the key's device).

    Returns:
        A tensor of ``shape`` and ``dtype``.

    Raises:
        TypeError: for a bad key, shape or dtype.

    Example:
        >>> sbfunc.random.gumbel(sbfunc.random.key(0), (2, 3)).shape
        torch.Size([2, 3])

    References:
        JAX ``jax.random.gumbel``; Kool, van Hoof and Welling 2019, "Stochastic Beams and
        Where to Find Them" (Gumbel-top-k).
    """
    return gumbel_from_uniform(uniform(k, shape, dtype=dtype, device=device))


def gumbel_from_uniform(u: torch.Tensor) -> torch.Tensor:
    """Map uniform noise in ``[0, 1)`` to standard Gumbel noise, ``-log(-log(u))``.

    Args:
        u: uniform noise (``0`` is clamped to the smallest normal float).

    Returns:
        Gumbel noise of the same shape and dtype.

    Example:
        >>> sbfunc.random.gumbel_from_uniform(torch.tensor([0.5]))
        tensor([0.3665])

    References:
        Maddison, Tarlow and Minka 2014, "A* Sampling" (Gumbel noise as the inverse CDF).
    """
    return -torch.log(-torch.log(u.clamp_min(torch.finfo(u.dtype).tiny)))


def bernoulli(
    k: Key,
    p: float | torch.Tensor,
    shape: Shape | None = None,
    *,
    device: Device = None,
) -> torch.Tensor:
    """Bernoulli draws, ``uniform(k, shape) < p``: ``True`` with probability ``p``.

    Args:
        k: the key.
        p: a probability in ``[0, 1]``, or a tensor of them (values not checked: no sync),
            broadcast against ``shape``; a floating tensor sets the uniform's dtype.
        shape: the output shape (default: ``p``'s shape, ``()`` for a float).
        device: where to draw (default: ``p``'s device for a tensor, else the key's).

    Returns:
        A ``bool`` tensor of ``shape``.

    Raises:
        TypeError: for a bad key, shape or ``p``.
        ValueError: if a float ``p`` is outside ``[0, 1]``.

    Example:
        >>> sbfunc.random.bernoulli(sbfunc.random.key(0), 0.3, 8)
        tensor([False, False, False, False, False,  True, False, False])

    References:
        JAX ``jax.random.bernoulli``.
    """
    if isinstance(p, torch.Tensor):
        dev = p.device if device is None else torch.device(device)
        dtype = p.dtype if p.dtype.is_floating_point else torch.float32
        out_shape = tuple(p.shape) if shape is None else shape
        return uniform(k, out_shape, dtype=dtype, device=dev) < p.to(dev)
    prob = check_fraction(p, "p")
    return uniform(k, () if shape is None else shape, device=device) < prob
