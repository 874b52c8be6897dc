"""The GGN's leading eigenpairs on a subset, from the Gram matrix of its square-root factors
(ViViT).

With the factors of the selected samples stacked as the columns of ``V`` (``P x R S``),
``G = V V^T``: its nonzero eigenvalues are those of the small Gram matrix
``V^T V = U diag(lambda) U^T`` (``R S x R S``), and its eigenvectors are
``V U diag(lambda)^(-1/2)``. So ``R S`` (the number of columns) bounds the cost, not the
parameter count ``P``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from sbfunc.per_sample._factors import cat_factors, transform
from sbfunc.per_sample._request import curvature
from sbfunc.per_sample._transforms import PerSampleTransform
from sbfunc.types import Params, PerSample
from sbfunc.validation import check_int

__all__ = ["GGNEigen", "ggn_eigen"]


class GGNEigen(NamedTuple):
    """Leading GGN eigenpairs.

    Attributes:
        eigenvalues: ``Tensor[k]``, in descending order.
        eigenvectors: ``{name: Tensor[k, *shape]}``: eigenvector ``j`` split by parameter
            (orthonormal across all the differentiated parameters together); zero for an
            eigenvalue that is numerically zero.

    Example:
        >>> from sbfunc.per_sample import GGNEigen
        >>> GGNEigen(torch.ones(1), {"w": torch.ones(1, 1)}).eigenvalues
        tensor([1.])

    References:
        Dangel, Tatzel and Hennig 2022, "ViViT: Curvature access through the generalized
        Gauss-Newton's low-rank structure".
    """

    eigenvalues: torch.Tensor
    eigenvectors: Params


def _identity(factors: Params) -> Params:
    return factors


def _eigenpairs(factors: Params, k: int | None) -> GGNEigen:
    flat = {name: f.flatten(0, 1).flatten(1) for name, f in factors.items()}  # [R S, P_name]
    columns = next(iter(flat.values())).shape[0]
    k = columns if k is None else k
    if k > columns:
        raise ValueError(
            f"k must be at most the number of factor columns R * S = {columns} (the GGN of the "
            f"subset has no more nonzero eigenvalues), got {k}"
        )
    gram = sum(v @ v.T for v in flat.values())
    assert isinstance(gram, torch.Tensor)
    values, vectors = torch.linalg.eigh(gram)
    values, vectors = values.flip(0)[:k], vectors.flip(1)[:, :k]
    eps = torch.finfo(values.dtype).eps
    tol = values[:1].clamp_min(0) * (columns * eps)
    scale = torch.where(values > tol, values.clamp_min(eps).rsqrt(), torch.zeros_like(values))
    coef = (vectors * scale).T  # [k, R S]
    eigenvectors = {
        name: (coef @ v).reshape(k, *factors[name].shape[2:]) for name, v in flat.items()
    }
    return GGNEigen(values, eigenvectors)


def ggn_eigen(
    loss_fn: Any,
    *,
    k: int | None = None,
    mc_samples: int | None = None,
    reduction: str = "mean",
    wrt: Sequence[str] | None = None,
    per_sample: PerSample = None,
) -> PerSampleTransform[GGNEigen]:
    """The ``k`` leading eigenpairs of the GGN of the selected samples, with parameter-shaped
    eigenvectors (ViViT's low-rank access to the GGN).

    The factors of :func:`sqrt_ggn_exact` (or of :func:`sqrt_ggn_mc` with ``mc_samples``) give
    the Gram matrix ``V^T V`` of size ``R S``; its eigendecomposition ``U diag(lambda) U^T``
    gives the eigenvalues ``lambda`` of ``G = V V^T`` and its eigenvectors
    ``V U diag(lambda)^(-1/2)``. Cost: the factors (``R S`` parameter-sized tensors, all kept
    for the Gram matrix; ``chunk_size`` bounds only the forward/backward memory), an
    ``(R S)^2 P`` Gram product and an ``(R S)^3`` eigendecomposition. A subset (or Monte-Carlo
    factors, ``M < C``) makes it cheap.

    Args:
        loss_fn: the per-sample loss (as for :func:`sqrt_ggn_exact`).
        k: how many leading eigenpairs (``1 <= k <= R S``; default: all ``R S``).
        mc_samples: ``None`` for the exact GGN, or ``M >= 1`` for the Monte-Carlo factors
            (then calls need ``key``).
        reduction: ``"mean"`` or ``"sum"`` (as for :func:`sqrt_ggn_exact`).
        wrt: parameter names or module prefixes (default: all).
        per_sample: which leaves of the batch are per-sample
            (:data:`sbfunc.types.PerSample`; default: inferred).

    Returns:
        ``f(params, buffers, batch, *, subsampling=None, chunk_size=None, key=None) ->``
        :class:`GGNEigen`.

    Raises:
        TypeError: as :func:`sqrt_ggn_exact`, and for a ``k`` that is not an int.
        ValueError: as :func:`sqrt_ggn_exact`, and for ``k < 1``; calls raise it for
            ``k > R S``.

    Example:
        >>> model = torch.nn.Linear(4, 3)
        >>> loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy)
        >>> params, buffers = sbfunc.split_module(model)
        >>> batch = (torch.randn(8, 4), torch.randint(0, 3, (8,)))
        >>> from sbfunc.per_sample import ggn_eigen, ggn_vector_product
        >>> eig = ggn_eigen(loss_fn, k=2)(params, buffers, batch, subsampling=[0, 5])
        >>> eig.eigenvalues.shape, eig.eigenvectors["weight"].shape
        (torch.Size([2]), torch.Size([2, 3, 4]))
        >>> v = {name: e[0] for name, e in eig.eigenvectors.items()}
        >>> gv = ggn_vector_product(loss_fn)(params, buffers, batch, v, subsampling=[0, 5])
        >>> bool(torch.allclose(gv["weight"], eig.eigenvalues[0] * v["weight"], atol=1e-5))
        True

    References:
        Dangel, Tatzel and Hennig 2022, "ViViT: Curvature access through the generalized
        Gauss-Newton's low-rank structure"; Dangel et al. 2020, "BackPACK" (``SqrtGGNExact``).
    """
    if k is not None:
        check_int(k, "k", low=1, fix="or None for all")
    c = curvature(
        loss_fn, reduction=reduction, mc_samples=mc_samples, wrt=wrt, per_sample=per_sample
    )

    return transform(c, _identity, lambda parts: _eigenpairs(cat_factors(parts), k))
