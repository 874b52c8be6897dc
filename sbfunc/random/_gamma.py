"""Gamma and Beta draws with a static shape (Marsaglia-Tsang with a fixed proposal budget).

Marsaglia and Tsang's rejection sampler accepts a proposal with probability above 0.95 for
every shape ``alpha >= 1``. Instead of a data-dependent loop, each sample gets a fixed number of
vectorised proposals and keeps the first accepted one (an argmax over the acceptance mask);
with 8 proposals the chance that none is accepted is below ``0.05**8 ~ 4e-11`` per sample, and
such a sample falls back to the sampler's centre ``d`` (``alpha - 1/3``). Shapes ``alpha < 1``
use the boost ``Gamma(alpha) = Gamma(alpha + 1) * U**(1/alpha)``. Everything is computed in log
space, so a Beta draw is ``sigmoid(log X - log Y)`` and stays finite for tiny shapes (MixUp's
``Beta(0.2, 0.2)`` puts much of its mass within ``1e-10`` of 0 and 1).
"""

from __future__ import annotations

import torch

from sbfunc.random._keys import Key, check_key, split
from sbfunc.random._sampling import (
    Shape,
    check_float_dtype,
    normal,
    target_device,
    uniform,
)
from sbfunc.random._threefry import normalize_shape
from sbfunc.types import Device

__all__ = ["beta", "gamma"]

_PROPOSALS = 8


def _shape_param(
    value: float | torch.Tensor, name: str, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """A positive float or a tensor of shape parameters, as a ``dtype`` tensor on ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device=device, dtype=dtype)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float or a tensor, got {value!r}")
    if not 0 < value < float("inf"):
        raise ValueError(f"{name} must be a positive finite float, got {value!r}")
    return torch.full((), float(value), dtype=dtype, device=device)


def _device(k: Key, device: Device, *params: float | torch.Tensor) -> torch.device:
    """``device`` if given, else the first tensor parameter's device, else the key's."""
    if device is None:
        for p in params:
            if isinstance(p, torch.Tensor):
                return p.device
    return target_device(k, device)


def _log_gamma(k: Key, alpha: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """``log`` of Gamma(``alpha``, 1) draws of ``shape`` (``alpha`` broadcasts to it)."""
    alpha = alpha.expand(shape)
    dtype, dev = alpha.dtype, alpha.device
    boosted = alpha < 1
    d = torch.where(boosted, alpha + 1, alpha) - 1.0 / 3.0
    c = torch.rsqrt(9.0 * d)
    k_norm, k_unif, k_boost = split(k, 3)
    x = normal(k_norm, (_PROPOSALS, *shape), dtype=dtype, device=dev)
    u = uniform(k_unif, (_PROPOSALS, *shape), dtype=dtype, device=dev)
    v = (1.0 + c * x) ** 3
    log_v = torch.log(v)  # NaN where v <= 0: those proposals are rejected below
    accepted = (v > 0) & (torch.log(u) < 0.5 * x * x + d - d * v + d * log_v)
    first = accepted.to(torch.uint8).argmax(0, keepdim=True)
    log_dv = torch.log(d) + log_v.gather(0, first).squeeze(0)
    log_dv = torch.where(accepted.any(0), log_dv, torch.log(d))
    u_boost = uniform(k_boost, shape, dtype=dtype, device=dev).clamp_min(torch.finfo(dtype).tiny)
    return torch.where(boosted, log_dv + torch.log(u_boost) / alpha, log_dv)


def gamma(
    k: Key,
    alpha: float | torch.Tensor,
    shape: Shape | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    device: Device = None,
) -> torch.Tensor:
    """Gamma(``alpha``, 1) draws with a static shape, traceable by ``torch.compile``.

    Args:
        k: the key.
        alpha: the shape parameter, ``> 0``: a float or a tensor broadcast against ``shape``
            (tensor values are not checked: no sync).
        shape: the output shape (default: ``alpha``'s shape, ``()`` for a float).
        dtype: a floating-point dtype.
        device: where to draw (default: ``alpha``'s device for a tensor, else the key's).

    Returns:
        A tensor of ``shape`` and ``dtype`` with positive values (possibly 0 after underflow
        for tiny ``alpha``).

    Raises:
        TypeError: for a bad key, shape or dtype.
        ValueError: if a float ``alpha`` is not positive.

    Example:
        >>> g = sbfunc.random.gamma(sbfunc.random.key(0), 2.0, (10_000,))
        >>> round(g.mean().item(), 1)
        2.0

    References:
        Marsaglia and Tsang 2000, "A Simple Method for Generating Gamma Variables"; JAX
        ``jax.random.gamma``.
    """
    check_key(k, "k")
    dtype = check_float_dtype(dtype)
    a = _shape_param(alpha, "alpha", dtype, _device(k, device, alpha))
    out_shape = tuple(a.shape) if shape is None else normalize_shape(shape)
    return torch.exp(_log_gamma(k, a, out_shape))


def beta(
    k: Key,
    a: float | torch.Tensor,
    b: float | torch.Tensor,
    shape: Shape | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    device: Device = None,
) -> torch.Tensor:
    """Beta(``a``, ``b``) draws, ``X / (X + Y)`` for ``X ~ Gamma(a)``, ``Y ~ Gamma(b)``.

    Computed as ``sigmoid(log X - log Y)``, so tiny shapes give values near 0 and 1, never NaN.

    Args:
        k: the key.
        a: the first shape parameter, ``> 0`` (float or tensor).
        b: the second shape parameter, ``> 0`` (float or tensor).
        shape: the output shape (default: the broadcast shape of ``a`` and ``b``).
        dtype: a floating-point dtype.
        device: where to draw (default: a tensor parameter's device, else the key's).

    Returns:
        A tensor of ``shape`` and ``dtype`` in ``[0, 1]``.

    Raises:
        TypeError: for a bad key, shape or dtype.
        ValueError: if a float parameter is not positive.

    Example:
        >>> lam = sbfunc.random.beta(sbfunc.random.key(0), 0.2, 0.2, (4,))
        >>> lam.shape, bool(((lam >= 0) & (lam <= 1)).all())
        (torch.Size([4]), True)

    References:
        Devroye 1986, "Non-Uniform Random Variate Generation", ch. IX.4 (Beta from two
        Gammas); Zhang et al. 2018, "mixup: Beyond Empirical Risk Minimization"; JAX
        ``jax.random.beta`` (log space).
    """
    check_key(k, "k")
    dtype = check_float_dtype(dtype)
    dev = _device(k, device, a, b)
    a_t = _shape_param(a, "a", dtype, dev)
    b_t = _shape_param(b, "b", dtype, dev)
    if shape is None:
        out_shape = tuple(torch.broadcast_shapes(a_t.shape, b_t.shape))
    else:
        out_shape = normalize_shape(shape)
    k_a, k_b = split(k)
    return torch.sigmoid(_log_gamma(k_a, a_t, out_shape) - _log_gamma(k_b, b_t, out_shape))
