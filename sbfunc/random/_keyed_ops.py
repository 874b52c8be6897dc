"""Keyed re-implementations of torch's random ops, used by :func:`sbfunc.random.keyed`.

Each function takes the call's key first (positional-only), then exactly the arguments of the
torch function it replaces, and reproduces that function's semantics with noise drawn from the
key. The dropout family follows ATen's ``_dropout_impl``: ``p == 0``, ``train=False`` or an empty
input return the input itself, ``p == 1`` multiplies by zero, the mask keeps each element (each
channel, for feature dropout) with probability ``1 - p`` and is scaled by ``1 / (1 - p)``;
alpha dropout applies SELU's affine correction.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from sbfunc.random._keys import Key
from sbfunc.random._sampling import bernoulli, normal, uniform

__all__ = [
    "FUNCTIONAL_DROPOUT",
    "RAND",
    "RANDN",
    "RANDN_LIKE",
    "RAND_LIKE",
    "VF_DROPOUT",
    "bernoulli_",
    "sdpa",
    "take_bernoulli",
]

# -SELU's negative saturation divided by its scale (Klambauer et al. 2017): the value alpha
# dropout gives a dropped unit before the affine correction.
_SELU_ALPHA = 1.7580993408473766


def dropout(
    x: torch.Tensor,
    p: float,
    train: bool,
    k: Key,
    *,
    feature: bool = False,
    alpha: bool = False,
    inplace: bool = False,
) -> torch.Tensor:
    """Keyed dropout with ATen's semantics; the keep-mask is ``bernoulli(k, 1 - p, shape)``."""
    if not 0.0 <= p <= 1.0:
        raise RuntimeError(f"dropout probability has to be between 0 and 1, but got {p}")
    if p == 0 or not train or x.numel() == 0:
        return x
    if p == 1:
        return x.mul_(0) if inplace else x * 0
    if feature and x.dim() < 2:
        raise RuntimeError(f"feature dropout needs an input of at least 2 dims, got {x.dim()}")
    shape = (*x.shape[:2], *([1] * (x.dim() - 2))) if feature else tuple(x.shape)
    keep = bernoulli(k, 1.0 - p, shape, device=x.device).to(x.dtype)
    if not alpha:
        noise = keep / (1.0 - p)
        return x.mul_(noise) if inplace else x * noise
    a = 1.0 / math.sqrt((_SELU_ALPHA**2 * p + 1) * (1 - p))
    shift = (keep - 1) * (_SELU_ALPHA * a) + _SELU_ALPHA * a * p
    noise = keep * a
    return x.mul_(noise).add_(shift) if inplace else x * noise + shift


def _check_p(p: float) -> None:
    if p < 0.0 or p > 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")


def _functional(
    *, feature: bool, alpha: bool, training: bool, spatial: int = 0
) -> Callable[..., torch.Tensor]:
    """The keyed twin of one of ``F.dropout``, ``F.dropout{1,2,3}d``, ``F.(feature_)alpha_dropout``
    (``spatial``: the spatial rank of ``dropout{spatial}d``, whose unbatched input gains a batch
    dim; 0 for the others)."""

    def functional(
        k: Key,
        /,
        input: torch.Tensor,
        p: float = 0.5,
        training: bool = training,
        inplace: bool = False,
    ) -> torch.Tensor:
        _check_p(p)
        if spatial == 1 and input.dim() not in (2, 3):
            raise RuntimeError(f"dropout1d: expected a 2-D or 3-D input, got {input.dim()}-D")
        unbatched = spatial in (1, 3) and input.dim() == spatial + 1
        x = input.unsqueeze(0) if unbatched else input
        out = dropout(x, p, training, k, feature=feature, alpha=alpha, inplace=inplace)
        return out.squeeze(0) if unbatched else out

    return functional


def _vf(*, feature: bool, alpha: bool, inplace: bool) -> Callable[..., torch.Tensor]:
    """The keyed twin of ``torch.dropout``-like ATen functions ``(input, p, train)``."""

    def vf(k: Key, /, input: torch.Tensor, p: float, train: bool) -> torch.Tensor:
        return dropout(input, p, train, k, feature=feature, alpha=alpha, inplace=inplace)

    return vf


FUNCTIONAL_DROPOUT = {
    F.dropout: _functional(feature=False, alpha=False, training=True),
    F.dropout1d: _functional(feature=True, alpha=False, training=True, spatial=1),
    F.dropout2d: _functional(feature=True, alpha=False, training=True, spatial=2),
    F.dropout3d: _functional(feature=True, alpha=False, training=True, spatial=3),
    F.alpha_dropout: _functional(feature=False, alpha=True, training=False),
    F.feature_alpha_dropout: _functional(feature=True, alpha=True, training=False),
}

VF_DROPOUT = {
    getattr(torch, f"{prefix}dropout{suffix}"): _vf(feature=feature, alpha=alpha, inplace=inplace)
    for prefix, feature, alpha in (
        ("", False, False),
        ("feature_", True, False),
        ("alpha_", False, True),
        ("feature_alpha_", True, True),
    )
    for suffix, inplace in (("", False), ("_", True))
}


def sdpa(
    k: Key,
    /,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """Scaled dot-product attention whose attention-weight dropout is keyed (math formulation:
    ``dropout(softmax(q k^T * scale + bias)) v``); without dropout, torch's fused kernel."""
    if dropout_p == 0:
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask, 0.0, is_causal, scale=scale, enable_gqa=enable_gqa
        )
    if is_causal and attn_mask is not None:
        raise RuntimeError("scaled_dot_product_attention: pass attn_mask or is_causal, not both")
    if enable_gqa:
        key = key.repeat_interleave(query.size(-3) // key.size(-3), -3)
        value = value.repeat_interleave(query.size(-3) // value.size(-3), -3)
    factor = 1.0 / math.sqrt(query.size(-1)) if scale is None else scale
    scores = (query @ key.transpose(-2, -1)) * factor
    if is_causal:
        n_q, n_k = query.size(-2), key.size(-2)
        allowed = torch.ones(n_q, n_k, dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    weights = dropout(torch.softmax(scores, -1), dropout_p, True, k)
    return weights @ value


def _size(dims: tuple[Any, ...], size: Sequence[int] | None) -> tuple[int, ...]:
    if size is not None:
        return tuple(size)
    if len(dims) == 1 and not isinstance(dims[0], int):
        return tuple(dims[0])
    return tuple(dims)


def _finish(t: torch.Tensor, out: torch.Tensor | None, requires_grad: bool) -> torch.Tensor:
    if out is not None:
        return out.copy_(t)
    return t.requires_grad_() if requires_grad else t


def _factory(sample: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """The keyed twin of ``torch.rand`` / ``torch.randn`` (``sample``: uniform / normal)."""

    def factory(
        k: Key,
        /,
        *dims: Any,
        size: Sequence[int] | None = None,
        out: torch.Tensor | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        requires_grad: bool = False,
        **_: Any,  # layout, pin_memory, names, generator=None: no effect on the values
    ) -> torch.Tensor:
        shape = _size(dims, size)
        if out is not None:
            dtype, device = dtype or out.dtype, device or out.device
        t = sample(
            k,
            shape,
            dtype=dtype or torch.get_default_dtype(),
            device=torch.empty(0).device if device is None else device,  # the default device
        )
        return _finish(t, out, requires_grad)

    return factory


def _like(sample: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """The keyed twin of ``torch.rand_like`` / ``torch.randn_like``."""

    def like_(
        k: Key,
        /,
        input: torch.Tensor,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        requires_grad: bool = False,
        **_: Any,  # layout, memory_format, generator=None
    ) -> torch.Tensor:
        t = sample(
            k, tuple(input.shape), dtype=dtype or input.dtype, device=device or input.device
        )
        return _finish(t, None, requires_grad)

    return like_


def take_bernoulli(
    k: Key,
    /,
    input: torch.Tensor,
    p: float | None = None,
    *,
    out: torch.Tensor | None = None,
    **_: Any,  # generator=None
) -> torch.Tensor:
    """The keyed twin of ``torch.bernoulli(input[, p])`` and ``Tensor.bernoulli``."""
    prob = input if p is None else p
    t = bernoulli(k, prob, tuple(input.shape), device=input.device).to(input.dtype)
    return _finish(t, out, False)


def bernoulli_(
    k: Key, /, self: torch.Tensor, p: float | torch.Tensor = 0.5, **_: Any
) -> torch.Tensor:
    """The keyed twin of ``Tensor.bernoulli_(p)``."""
    return self.copy_(bernoulli(k, p, tuple(self.shape), device=self.device))


RAND = _factory(uniform)
RANDN = _factory(normal)
RAND_LIKE = _like(uniform)
RANDN_LIKE = _like(normal)
