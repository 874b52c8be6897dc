"""Keys: making, checking and deriving them (``key``, ``split``, ``fold_in``)."""

from __future__ import annotations

import torch

from sbfunc._tracing import host_readable, tracing
from sbfunc.random._host import host_blocks, host_key, host_key_words, words
from sbfunc.random._threefry import MASK, Word, block, counters, host_block
from sbfunc.validation import check_int, describe

__all__ = ["Key", "check_key", "fold_in", "is_key", "key", "split"]

Key = torch.Tensor
"""A key: an ``int64`` tensor of shape ``(2,)`` holding two 32-bit words; build one with
:func:`key`."""

_HOST_SPLIT_MAX = 256  # above this many children, one vectorised tensor pass is cheaper


def is_key(obj: object) -> bool:
    """Whether ``obj`` has the form of a key: an ``int64`` tensor of shape ``(2,)``.

    Only the form is checked (dtype and shape, any device), never the values, so the check
    never reads an accelerator tensor.

    Args:
        obj: anything.

    Returns:
        ``True`` for an ``int64`` tensor of shape ``(2,)``.

    Example:
        >>> sbfunc.random.is_key(sbfunc.random.key(3)), sbfunc.random.is_key(3)
        (True, False)
    """
    return isinstance(obj, torch.Tensor) and obj.dtype == torch.int64 and tuple(obj.shape) == (2,)


def check_key(obj: object, name: str = "key") -> Key:
    """Return ``obj`` if it is a key (see :func:`is_key`), else raise a ``TypeError``.

    Args:
        obj: the value to check.
        name: the argument name to put in the message.

    Returns:
        ``obj`` itself.

    Raises:
        TypeError: if ``obj`` is not an ``int64`` tensor of shape ``(2,)``; the message names
            the argument, the expected form and what was received.

    Example:
        >>> sbfunc.random.check_key(torch.tensor(0))
        Traceback (most recent call last):
        ...
        TypeError: key must be an int64 tensor of shape (2,)...a torch.int64 tensor of shape ()
    """
    if not is_key(obj):
        raise TypeError(
            f"{name} must be an int64 tensor of shape (2,) made by sbfunc.random.key(seed), "
            f"got {describe(obj)}"
        )
    assert isinstance(obj, torch.Tensor)
    return obj


def key(seed: int, *, device: torch.device | str | None = None) -> Key:
    """Make a key from an integer seed.

    The seed is reduced modulo ``2**64`` and its high and low 32-bit halves become the two
    words, as JAX's ``threefry_seed`` does for a 64-bit seed, so ``key(s)`` equals
    ``jax.random.key_data(jax.random.key(s))`` (for negative seeds and seeds above ``2**32``,
    with ``jax_enable_x64``).

    Args:
        seed: any Python int.
        device: where the key lives (default: the CPU, where key derivation is host arithmetic).

    Returns:
        An ``int64`` tensor of shape ``(2,)``.

    Raises:
        TypeError: if ``seed`` is not an int (``bool`` included).

    Example:
        >>> sbfunc.random.key(42)
        tensor([ 0, 42])
        >>> sbfunc.random.key(-1)
        tensor([4294967295, 4294967295])

    References:
        JAX ``jax.random.key`` / ``PRNGKey`` (``threefry_seed``).
    """
    seed = check_int(seed, "seed")
    pair = ((seed >> 32) & MASK, seed & MASK)
    if (device is None or torch.device(device).type == "cpu") and not tracing():
        return host_key(pair)
    return torch.tensor(pair, dtype=torch.int64, device=device)


def _derive(k: Key, hi: Word, lo: Word) -> torch.Tensor:
    """Threefry of the counters ``(hi, lo)`` under ``k``, as int64 words stacked last."""
    w0, w1 = words(k)
    y0, y1 = block(w0, w1, hi, lo)
    return torch.stack([torch.as_tensor(y0), torch.as_tensor(y1)], -1)


def split(k: Key, num: int = 2) -> torch.Tensor:
    """Split a key into ``num`` new keys, statistically independent of each other and of ``k``.

    Child ``i`` is the Threefry-2x32 encryption of the counter ``(0, i)`` under ``k`` (JAX's
    "partitionable" split), so the result is bit-identical to ``jax.random.split`` and child
    ``i`` equals ``fold_in(k, i)``: derive a key either way from a given parent, not both.

    Args:
        k: the parent key (unchanged).
        num: how many children, ``>= 1``.

    Returns:
        An ``int64`` tensor of shape ``(num, 2)`` on the key's device; unpack it
        (``a, b = split(k)``) or index it.

    Raises:
        TypeError: if ``k`` is not a key or ``num`` not an int.
        ValueError: if ``num < 1``.

    Example:
        >>> a, b = sbfunc.random.split(sbfunc.random.key(0))
        >>> a
        tensor([1797259609, 2579123966])
        >>> sbfunc.random.split(sbfunc.random.key(0), 3).shape
        torch.Size([3, 2])

    References:
        JAX ``jax.random.split`` (``jax_threefry_partitionable=True``); Salmon et al. 2011,
        "Parallel Random Numbers: As Easy as 1, 2, 3" (Threefry).
    """
    k = check_key(k, "k")
    num = check_int(num, "num", low=1)
    if num <= _HOST_SPLIT_MAX and host_readable(k):
        w0, w1 = host_key_words(k)
        rows = host_blocks(w0, w1, num)
        return host_key([w for row in rows for w in row], (num, 2))
    hi, lo = counters((num,), k.device)
    return _derive(k, hi, lo)


def fold_in(k: Key, data: int | torch.Tensor) -> Key:
    """Derive a new key from ``k`` and an integer (a step, a rank, a sample id, a call index).

    The key is the Threefry-2x32 encryption of the counter ``(data >> 32, data)`` (``data``
    taken modulo ``2**64``) under ``k``: bit-identical to ``jax.random.fold_in`` for ``data``
    in ``[0, 2**32)``, and distinct for all 64-bit values. A Python int and a 0-d integer
    tensor holding the same value give the same key; pass a tensor (e.g. the step counter of
    a compiled train step) to keep the value out of the compiled graph's constants.

    Args:
        k: the parent key (unchanged).
        data: a Python int or a 0-d integer tensor (moved to the key's device; from an
            accelerator to a CPU key this is a device sync, so keep both on one device).

    Returns:
        A key on the key's device.

    Raises:
        TypeError: if ``k`` is not a key, or ``data`` neither an int nor an integer tensor.
        ValueError: if ``data`` is a tensor that is not 0-d.

    Example:
        >>> k = sbfunc.random.key(0)
        >>> sbfunc.random.fold_in(k, 1)
        tensor([ 928981903, 3453687069])
        >>> sbfunc.random.fold_in(k, torch.tensor(1))
        tensor([ 928981903, 3453687069])

    References:
        JAX ``jax.random.fold_in``; Salmon et al. 2011, "Parallel Random Numbers: As Easy as
        1, 2, 3".
    """
    k = check_key(k, "k")
    host = host_readable(k)
    if isinstance(data, torch.Tensor):
        if data.dtype.is_floating_point or data.dtype.is_complex or data.dtype == torch.bool:
            raise TypeError(f"data must be an int or an integer tensor, got {describe(data)}")
        if data.dim() != 0:
            raise ValueError(f"data must be a 0-d tensor, got shape {tuple(data.shape)}")
        if host and host_readable(data):
            data = int(data)
        else:
            d = data.to(device=k.device, dtype=torch.int64)
            return _derive(k, (d >> 32) & MASK, d & MASK)
    data = check_int(data, "data")
    if host:
        w0, w1 = host_key_words(k)
        return host_key(host_block(w0, w1, (data >> 32) & MASK, data & MASK))
    # As an int64 tensor: an int that became symbolic in a compiled graph (it crossed a
    # graph break) must stay in integer tensor arithmetic, never mix into it as a scalar.
    # While compiling, ``data`` may be symbolic (an int that crossed a graph break): no Python
    # arithmetic on it (its constants would overflow the compiler's int64 index maths), so
    # it must fit int64 there; eagerly it is reduced mod 2**64 to a signed int64.
    if not torch.compiler.is_compiling():
        data &= (1 << 64) - 1
        data = data - (1 << 64) if data >= 1 << 63 else data
    d = torch.full((), data, dtype=torch.int64, device=k.device)
    return _derive(k, (d >> 32) & MASK, d & MASK)
