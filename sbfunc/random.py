"""Explicit, splittable random keys (JAX-style) for PyTorch.

All randomness in sbfunc enters as a *key*: a 0-d ``int64`` tensor on the CPU holding a 64-bit
seed. Keys are pure values: the same key always yields the same noise, ``split`` derives
statistically independent child keys with the SplitMix64 finaliser (Steele et al. 2014), and a
key is an ordinary tensor, so it checkpoints with ``torch.save(..., weights_only=True)`` and
travels inside any optree pytree state.

Keys live on the CPU on purpose: turning a key into a seed is host arithmetic on a host tensor,
so no accelerator is ever synchronised. Noise itself is drawn on the device you ask for, from a
``torch.Generator`` seeded by the key. CPU and CUDA generators produce different streams, so a
key is reproducible per device type, not across them.

Example:
    >>> import sbfunc
    >>> key = sbfunc.random.key(0)
    >>> k1, k2 = sbfunc.random.split(key)
    >>> bool(torch.equal(sbfunc.random.uniform(k1, (3,)), sbfunc.random.uniform(k1, (3,))))
    True
    >>> bool(torch.equal(k1, k2))
    False
"""

from __future__ import annotations

import torch

__all__ = [
    "Key",
    "bits",
    "fold_in",
    "generator",
    "gumbel",
    "gumbel_from_uniform",
    "is_key",
    "key",
    "split",
    "uniform",
]

Key = torch.Tensor
"""A 0-d ``int64`` CPU tensor; build one with :func:`key`."""

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix(z: int) -> int:
    """SplitMix64 finaliser: a bijective avalanche mix of a 64-bit integer."""
    z = (z + _GOLDEN) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _to_tensor(value: int) -> Key:
    # Store the unsigned 64-bit value in a signed int64 tensor (two's complement).
    signed = value - (1 << 64) if value >= (1 << 63) else value
    return torch.tensor(signed, dtype=torch.int64)


def _to_int(k: Key) -> int:
    if not is_key(k):
        raise TypeError(
            "key must be a 0-d int64 CPU tensor made by sbfunc.random.key(seed); "
            f"got {type(k).__name__}"
            + (
                f" of shape {tuple(k.shape)}, dtype {k.dtype}, device {k.device}"
                if isinstance(k, torch.Tensor)
                else ""
            )
        )
    # A CPU scalar read: host arithmetic only, never an accelerator sync.
    return int(k) & _MASK


def is_key(k: object) -> bool:
    """Whether ``k`` is a valid key (0-d ``int64`` tensor on the CPU).

    Example:
        >>> sbfunc.random.is_key(sbfunc.random.key(3)), sbfunc.random.is_key(3)
        (True, False)

    References:
        JAX typed keys (JEP 9263), checked with
        ``jnp.issubdtype(k.dtype, jax.dtypes.prng_key)``.
    """
    return (
        isinstance(k, torch.Tensor)
        and k.dim() == 0
        and k.dtype == torch.int64
        and k.device.type == "cpu"
    )


def key(seed: int) -> Key:
    """Make a key from an integer seed.

    Args:
        seed: any Python integer; it is reduced modulo 2**64 and mixed.

    Returns:
        A 0-d ``int64`` CPU tensor.

    Example:
        >>> bool(torch.equal(sbfunc.random.key(7), sbfunc.random.key(7)))
        True

    References:
        JAX ``jax.random.key``; Steele, Lea and Flood 2014, "Fast Splittable Pseudorandom
        Number Generators" (the SplitMix64 finaliser).
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    return _to_tensor(_mix(seed & _MASK))


def split(k: Key, num: int = 2) -> tuple[Key, ...]:
    """Split a key into ``num`` new, independent keys.

    Example:
        >>> a, b, c = sbfunc.random.split(sbfunc.random.key(0), 3)
        >>> len({int(a), int(b), int(c)})
        3

    References:
        JAX ``jax.random.split``; Steele, Lea and Flood 2014, "Fast Splittable Pseudorandom
        Number Generators" (SplitMix64).
    """
    if isinstance(num, bool) or not isinstance(num, int) or num < 1:
        raise ValueError(f"num must be an int >= 1, got {num!r}")
    base = _to_int(k)
    return tuple(_to_tensor(_mix(_mix(base) ^ _mix(i + 1))) for i in range(num))


def fold_in(k: Key, data: int) -> Key:
    """Derive a new key from ``k`` and an integer (a step, a rank, a sample id).

    Example:
        >>> k = sbfunc.random.key(0)
        >>> bool(torch.equal(sbfunc.random.fold_in(k, 1), sbfunc.random.fold_in(k, 2)))
        False

    References:
        JAX ``jax.random.fold_in``.
    """
    if isinstance(data, bool) or not isinstance(data, int):
        raise TypeError(f"data must be an int, got {type(data).__name__}")
    return _to_tensor(_mix(_to_int(k) ^ _mix((data & _MASK) ^ 0x5851F42D4C957F2D)))


def generator(k: Key, device: torch.device | str | None = None) -> torch.Generator:
    """A fresh ``torch.Generator`` on ``device`` whose stream is determined by ``k``.

    Example:
        >>> g = sbfunc.random.generator(sbfunc.random.key(0))
        >>> torch.rand(2, generator=g).shape
        torch.Size([2])

    References:
        PyTorch ``torch.Generator(device=...)`` and ``Generator.manual_seed``.
    """
    g = torch.Generator(device=torch.device("cpu") if device is None else torch.device(device))
    # manual_seed takes a non-negative int below 2**64.
    g.manual_seed(_to_int(k))
    return g


def uniform(
    k: Key,
    shape: tuple[int, ...] | torch.Size,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Uniform noise in ``[0, 1)`` of ``shape``, drawn on ``device`` from key ``k``.

    Example:
        >>> u = sbfunc.random.uniform(sbfunc.random.key(0), (4,))
        >>> bool(((u >= 0) & (u < 1)).all())
        True

    References:
        JAX ``jax.random.uniform``; PyTorch ``torch.rand(..., generator=...)``.
    """
    dev = torch.device("cpu") if device is None else torch.device(device)
    return torch.rand(tuple(shape), generator=generator(k, dev), device=dev, dtype=dtype)


def bits(
    k: Key,
    shape: tuple[int, ...] | torch.Size,
    *,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Uniform random ``int64`` values in ``[0, 2**31)`` of ``shape``, drawn on ``device``.

    Example:
        >>> b = sbfunc.random.bits(sbfunc.random.key(0), (4,))
        >>> b.dtype, bool(((b >= 0) & (b < 2**31)).all())
        (torch.int64, True)

    References:
        JAX ``jax.random.bits`` (full-width unsigned integers there; 31 bits in ``int64``
        here); PyTorch ``torch.randint``.
    """
    dev = torch.device("cpu") if device is None else torch.device(device)
    return torch.randint(0, 2**31, tuple(shape), generator=generator(k, dev), device=dev)


def gumbel(
    k: Key,
    shape: tuple[int, ...] | torch.Size,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Standard Gumbel noise ``-log(-log(U))`` of ``shape``, drawn on ``device``.

    Example:
        >>> sbfunc.random.gumbel(sbfunc.random.key(0), (2, 3)).shape
        torch.Size([2, 3])

    References:
        JAX ``jax.random.gumbel``; Vieira 2014, "Gumbel-max trick" (blog); Kool, van Hoof and
        Welling 2019, "Stochastic Beams and Where to Find Them" (Gumbel-top-k).
    """
    return gumbel_from_uniform(uniform(k, shape, device=device, dtype=dtype))


def gumbel_from_uniform(u: torch.Tensor) -> torch.Tensor:
    """Map uniform noise in ``[0, 1)`` to standard Gumbel noise, ``-log(-log(u))``.

    Example:
        >>> sbfunc.random.gumbel_from_uniform(torch.tensor([0.5]))
        tensor([0.3665])

    References:
        Vieira 2014, "Gumbel-max trick" (blog); Maddison, Tarlow and Minka 2014, "A* Sampling"
        (Gumbel noise as ``-log(-log(U))``, the inverse CDF).
    """
    return -torch.log(-torch.log(u.clamp_min(torch.finfo(u.dtype).tiny)))
