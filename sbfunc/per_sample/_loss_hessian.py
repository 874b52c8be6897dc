"""Square roots of a criterion's Hessian with respect to the model output, exact and sampled.

For the supported criteria the Hessian of each loss element with respect to the logits does not
depend on the target, so it is a function of the model output ``f`` alone. With ``w`` the
weight a reduction gives one element (``1/(N E)`` for ``"mean"`` over ``N`` samples of ``E``
elements, ``1`` for ``"sum"``):

* cross-entropy (softmax over dim 1, per position): ``H = w (diag(p) - p p^T)``; exact square
  root ``sqrt(w) (diag(sqrt p) - p sqrt(p)^T)``, sampled ``sqrt(w) (onehot(y~) - p)`` with
  ``y~ ~ Categorical(p)`` (by inversion of one uniform);
* mean squared error: ``H = 2 w I``; ``sqrt(2 w) I``, sampled ``sqrt(2 w) eps`` with
  ``eps ~ N(0, I)``;
* binary cross-entropy with logits: ``H = w diag(s (1 - s))``, ``s = sigmoid(f)``;
  ``sqrt(w s (1 - s))``, sampled ``sqrt(w) (b - s)`` with ``b ~ Bernoulli(s)``.

Every sampled column ``v`` has ``E[v v^T] = H``; ``M`` columns are scaled by ``1/sqrt(M)`` so that
the sum of their outer products estimates ``H``.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from sbfunc.random import Key, split, uniform

__all__ = [
    "Kind",
    "criterion_kind",
    "draw_noise",
    "element_weight",
    "hessian_vector",
    "sampled_sqrt",
    "sqrt_hessian",
]

Kind = Literal["cross_entropy", "mse", "bce_with_logits"]

_FUNCTIONS: dict[Any, Kind] = {
    F.cross_entropy: "cross_entropy",
    F.mse_loss: "mse",
    F.binary_cross_entropy_with_logits: "bce_with_logits",
}
_MODULES: tuple[tuple[type[nn.Module], Kind], ...] = (
    (nn.CrossEntropyLoss, "cross_entropy"),
    (nn.MSELoss, "mse"),
    (nn.BCEWithLogitsLoss, "bce_with_logits"),
)
SUPPORTED = (
    "torch.nn.functional.cross_entropy / nn.CrossEntropyLoss (no class weights, no label "
    "smoothing), torch.nn.functional.mse_loss / nn.MSELoss and "
    "torch.nn.functional.binary_cross_entropy_with_logits / nn.BCEWithLogitsLoss (no weight, "
    "no pos_weight)"
)


def _unsupported(criterion: Any, why: str = "") -> ValueError:
    name = getattr(criterion, "__qualname__", None) or type(criterion).__name__
    return ValueError(
        f"the GGN is not available for the criterion {name}{why}; supported criteria: {SUPPORTED}"
    )


def criterion_kind(criterion: Any) -> Kind:
    """Which supported criterion ``criterion`` is.

    Args:
        criterion: the criterion given to :func:`sbfunc.per_sample_loss`.

    Returns:
        ``"cross_entropy"``, ``"mse"`` or ``"bce_with_logits"``.

    Raises:
        ValueError: for any other criterion, or a supported one with options that change its
            Hessian (class weights, label smoothing, ``pos_weight``); the message lists the
            supported criteria.

    Example:
        >>> criterion_kind(torch.nn.CrossEntropyLoss(reduction="none"))
        'cross_entropy'
        >>> criterion_kind(torch.nn.functional.l1_loss)
        Traceback (most recent call last):
        ...
        ValueError: the GGN is not available for the criterion l1_loss; supported criteria: ...
    """
    kind = _FUNCTIONS.get(criterion)
    if kind is not None:
        return kind
    for cls, kind in _MODULES:
        if isinstance(criterion, cls):
            for option in ("weight", "pos_weight"):
                if getattr(criterion, option, None) is not None:
                    raise _unsupported(criterion, f" with {option}=...")
            if getattr(criterion, "label_smoothing", 0.0) != 0.0:
                raise _unsupported(criterion, " with label_smoothing != 0")
            return kind
    raise _unsupported(criterion)


def element_weight(kind: Kind, out: torch.Tensor, n: int, reduction: str) -> float:
    """The weight of one loss element in the batch loss: ``1/(n E)`` for ``"mean"`` (``E`` loss
    elements per sample, as torch's ``reduction="mean"`` counts them), ``1`` for ``"sum"``.

    Args:
        kind: the criterion.
        out: the model output ``[m, *out]`` (only its shape is read).
        n: the size of the whole batch (also when sub-sampling).
        reduction: ``"mean"`` or ``"sum"``.

    Returns:
        The weight ``w``.

    Example:
        >>> element_weight("mse", torch.zeros(4, 5), 8, "mean")
        0.025
    """
    if reduction == "sum":
        return 1.0
    per_sample = math.prod(out.shape[1:])
    if kind == "cross_entropy":
        per_sample //= out.shape[1]
    return 1.0 / (n * per_sample)


def _positions(out: torch.Tensor) -> torch.Tensor:
    """Class scores ``[m, C, *D]`` as ``[m, C, prod(D)]``."""
    return out.reshape(out.shape[0], out.shape[1], -1)


def sqrt_hessian(kind: Kind, out: torch.Tensor, weight: float) -> torch.Tensor:
    """Exact square roots ``S_n`` of the loss Hessians, as ``[K, m, *out]`` with
    ``K = prod(out)``: ``sum_k V[k, n] V[k, n]^T`` is sample ``n``'s Hessian.

    Args:
        kind: the criterion.
        out: the (detached) model output ``[m, *out]``; cross-entropy needs ``dim >= 2``.
        weight: the element weight (:func:`element_weight`).

    Returns:
        ``V`` of shape ``[K, m, *out]``, column ``k`` first.

    Example:
        >>> v = sqrt_hessian("cross_entropy", torch.zeros(1, 2), 1.0)[:, 0]
        >>> v @ v.T  # diag(p) - p p^T with p = (1/2, 1/2)
        tensor([[ 0.2500, -0.2500],
                [-0.2500,  0.2500]])

    References:
        Dangel et al. 2020, "BackPACK" (the loss Hessian square roots of ``SqrtGGNExact``).
    """
    m, k = out.shape[0], math.prod(out.shape[1:])
    if kind == "cross_entropy":
        p = _positions(out).softmax(1).transpose(1, 2)  # [m, D, C]
        sq = p.sqrt()
        blocks = torch.diag_embed(sq) - p[..., :, None] * sq[..., None, :]  # [m, D, C, C']
        # column (c', d') is block d''s column c' placed at position d
        v = torch.diag_embed(blocks.permute(3, 0, 2, 1))  # [C', m, C, D, D']
        v = v.permute(0, 4, 1, 2, 3)  # [C', D', m, C, D]
        return v.reshape(k, m, *out.shape[1:]) * math.sqrt(weight)
    if kind == "mse":
        diag = torch.full((m, k), math.sqrt(2.0 * weight), dtype=out.dtype, device=out.device)
    else:
        s = out.reshape(m, k).sigmoid()
        diag = (s * (1 - s) * weight).sqrt()
    return torch.diag_embed(diag).permute(2, 0, 1).reshape(k, m, *out.shape[1:])


_HOST_DRAWS = 64  # up to this many uniforms, the cipher runs on host ints (per-op overhead)


def _uniform(k: Key, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """Uniforms in ``[0, 1)``: ``sbfunc.random.uniform`` (hundreds of small tensor ops, about a
    millisecond on a CPU), or for a few numbers on a host key the children of
    ``sbfunc.random.split`` (the cipher on Python ints, tens of microseconds per number), their
    random words read as the float's mantissa."""
    count = math.prod(shape)
    if count > _HOST_DRAWS or k.device.type != "cpu":
        return uniform(k, shape, dtype=like.dtype, device=like.device)
    words = split(k, count)  # [count, 2] of independent 32-bit words
    if like.dtype == torch.float64:
        bits = (words[:, 0] << 20) | (words[:, 1] >> 12)
        u = bits.to(torch.float64) * 2.0**-52
    else:
        u = (words[:, 0] >> 9).to(torch.float64) * 2.0**-23
    return u.to(dtype=like.dtype, device=like.device).reshape(shape)


def draw_noise(kind: Kind, k: Key, mc_samples: int, like: torch.Tensor, s: int) -> torch.Tensor:
    """The uniforms behind :func:`sampled_sqrt` for all ``s`` selected samples at once (so the
    result does not depend on how the samples are chunked): one per draw, of shape
    ``[M, s, *D]`` for cross-entropy (``D``: the positions after the class axis) and
    ``[M, s, *out]`` otherwise.

    Args:
        kind: the criterion.
        k: the key.
        mc_samples: ``M``.
        like: an output ``[m, *out]`` giving the per-sample shape, dtype and device.
        s: the number of selected samples.

    Returns:
        Uniforms in ``[0, 1)``.

    Example:
        >>> draw_noise("mse", sbfunc.random.key(0), 3, torch.zeros(1, 2), 5).shape
        torch.Size([3, 5, 2])
    """
    per_sample = like.shape[2:] if kind == "cross_entropy" else like.shape[1:]
    return _uniform(k, (mc_samples, s, *per_sample), like)


def sampled_sqrt(
    kind: Kind, out: torch.Tensor, weight: float, noise: torch.Tensor
) -> torch.Tensor:
    """Monte-Carlo square roots ``[M, m, *out]``: ``sum_k V[k, n] V[k, n]^T`` estimates sample
    ``n``'s loss Hessian without bias.

    Args:
        kind: the criterion.
        out: the (detached) model output ``[m, *out]``.
        weight: the element weight (:func:`element_weight`).
        noise: this chunk's slice of :func:`draw_noise`, ``[M, m, ...]``.

    Returns:
        ``V`` of shape ``[M, m, *out]``.

    Example:
        >>> out = torch.zeros(1, 3)
        >>> noise = draw_noise("cross_entropy", sbfunc.random.key(0), 4, out, 1)
        >>> sampled_sqrt("cross_entropy", out, 1.0, noise).shape
        torch.Size([4, 1, 3])

    References:
        Dangel et al. 2020, "BackPACK" (``SqrtGGNMC``); Martens 2014, "New insights and
        perspectives on the natural gradient method" (sampled Fisher); Devroye 1986,
        "Non-Uniform Random Variate Generation" (inversion).
    """
    scale = math.sqrt(weight / noise.shape[0])
    if kind == "cross_entropy":
        p = _positions(out).softmax(1)  # [m, C, D]
        cdf = p.transpose(1, 2).cumsum(-1)  # [m, D, C]
        u = noise.reshape(noise.shape[0], out.shape[0], -1).permute(1, 2, 0)  # [m, D, M]
        drawn = torch.searchsorted(cdf.contiguous(), u.contiguous() * cdf[..., -1:], right=True)
        drawn = drawn.clamp_max(out.shape[1] - 1).permute(2, 0, 1)  # [M, m, D]: inversion
        onehot = F.one_hot(drawn, out.shape[1]).movedim(-1, 2).to(out.dtype)  # [M, m, C, D]
        return ((onehot - p) * scale).reshape(noise.shape[0], *out.shape)
    if kind == "mse":
        low = -1.0 + torch.finfo(noise.dtype).eps
        eps = torch.erfinv((noise * 2 - 1).clamp_min(low)) * math.sqrt(2.0)  # N(0, 1)
        return eps * (scale * math.sqrt(2.0))
    s = out.sigmoid()
    return ((noise < s).to(out.dtype) - s) * scale


def hessian_vector(kind: Kind, out: torch.Tensor, weight: float, u: torch.Tensor) -> torch.Tensor:
    """The loss Hessians applied to output-space vectors, ``H_n u_n`` for every sample.

    Args:
        kind: the criterion.
        out: the (detached) model output ``[m, *out]``.
        weight: the element weight (:func:`element_weight`).
        u: vectors shaped like ``out``.

    Returns:
        ``H u``, shaped like ``out``.

    Example:
        >>> hessian_vector("mse", torch.zeros(1, 2), 0.5, torch.tensor([[1.0, 2.0]]))
        tensor([[1., 2.]])

    References:
        Schraudolph 2002, "Fast curvature matrix-vector products for second-order gradient
        descent".
    """
    if kind == "cross_entropy":
        p = out.softmax(1)
        return (p * u - p * (p * u).sum(1, keepdim=True)) * weight
    if kind == "mse":
        return u * (2.0 * weight)
    s = out.sigmoid()
    return s * (1 - s) * u * weight
