"""GGN quantities BackPACK computes only on the full batch, on any subset: the diagonal, its
per-sample version and GGN-vector products.

All are reductions of the square-root factors ``F[r, i]`` of :mod:`sbfunc.per_sample`
(chunk by chunk, so only one chunk's factors are ever alive): the diagonal is
``sum_{r, i} F[r, i]^2`` elementwise, the per-sample diagonal ``sum_r F[r, i]^2``. The product
``G v = sum_i J_i^T H_i J_i v`` is taken without factors: one forward, a double backward for
``J v`` and one backward for ``J^T (H J v)`` (from the factors where a layer has no double
backward, as fused attention kernels).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from sbfunc.per_sample._factors import factor_iter, transform
from sbfunc.per_sample._intercept import LayerRecorder
from sbfunc.per_sample._loss_hessian import element_weight, hessian_vector
from sbfunc.per_sample._request import Chunk, Curvature, check_curvature_output, chunks, curvature
from sbfunc.per_sample._transforms import PerSampleTransform
from sbfunc.types import Params, PerSample

__all__ = [
    "batch_diag_ggn_exact",
    "batch_diag_ggn_mc",
    "diag_ggn_exact",
    "diag_ggn_mc",
    "ggn_vector_product",
]


def _diag(factors: Params) -> Params:
    return {k: f.square().sum((0, 1)) for k, f in factors.items()}


def _sum(parts: list[Params]) -> Params:
    return {k: torch.stack([p[k] for p in parts]).sum(0) for k in parts[0]}


def _batch_diag(factors: Params) -> Params:
    return {k: f.square().sum(0) for k, f in factors.items()}


def _cat(parts: list[Params]) -> Params:
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def diag_ggn_exact(
    loss_fn: Any,
    *,
    reduction: str = "mean",
    wrt: Sequence[str] | None = None,
    per_sample: PerSample = None,
) -> PerSampleTransform[Params]:
    """The GGN diagonal of the selected samples, shaped like each parameter.

    ``diag(G_S) = sum_{c, i} F[c, i]^2`` over the exact factors of :func:`sqrt_ggn_exact`:
    BackPACK's ``DiagGGNExact`` (``param.diag_ggn_exact``), which it computes only on the
    whole batch; ``subsampling`` restricts the sum to the selected samples (a repeated index
    counts twice), with the weight ``1/N`` of a ``"mean"`` reduction kept at the whole batch.

    Args:
        loss_fn: the per-sample loss (as for :func:`sqrt_ggn_exact`).
        reduction: ``"mean"`` or ``"sum"`` (as for :func:`sqrt_ggn_exact`).
        wrt: parameter names or module prefixes (default: all).
        per_sample: which leaves of the batch are per-sample
            (:data:`sbfunc.types.PerSample`; default: inferred).

    Returns:
        ``f(params, buffers, batch, *, subsampling=None, chunk_size=None) -> dict``.

    Raises:
        TypeError: as :func:`sqrt_ggn_exact`.
        ValueError: as :func:`sqrt_ggn_exact`.

    Example:
        >>> model = torch.nn.Linear(4, 3)
        >>> loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy)
        >>> params, buffers = sbfunc.split_module(model)
        >>> batch = (torch.randn(6, 4), torch.randint(0, 3, (6,)))
        >>> from sbfunc.per_sample import diag_ggn_exact, sqrt_ggn_exact
        >>> diag = diag_ggn_exact(loss_fn)(params, buffers, batch, subsampling=[5, 1])
        >>> factors = sqrt_ggn_exact(loss_fn)(params, buffers, batch, subsampling=[5, 1])
        >>> bool(torch.allclose(diag["weight"], factors["weight"].square().sum((0, 1))))
        True

    References:
        Dangel et al. 2020, "BackPACK" (``DiagGGNExact``); Martens et al. 2012, "Estimating the
        Hessian by back-propagating curvature".
    """
    c = curvature(loss_fn, reduction=reduction, mc_samples=None, wrt=wrt, per_sample=per_sample)
    return transform(c, _diag, _sum)


def diag_ggn_mc(
    loss_fn: Any,
    *,
    mc_samples: int = 1,
    reduction: str = "mean",
    wrt: Sequence[str] | None = None,
    per_sample: PerSample = None,
) -> PerSampleTransform[Params]:
    """A Monte-Carlo estimate of the GGN diagonal of the selected samples (BackPACK's
    ``DiagGGNMC``, on any subset): ``sum_{m, i} F[m, i]^2`` over :func:`sqrt_ggn_mc`'s factors.

    Args:
        loss_fn: the per-sample loss (as for :func:`sqrt_ggn_exact`).
        mc_samples: ``M >= 1``.
        reduction: ``"mean"`` or ``"sum"`` (as for :func:`sqrt_ggn_exact`).
        wrt: parameter names or module prefixes (default: all).
        per_sample: which leaves of the batch are per-sample
            (:data:`sbfunc.types.PerSample`; default: inferred).

    Returns:
        ``f(params, buffers, batch, *, key, subsampling=None, chunk_size=None) -> dict``.

    Raises:
        TypeError: as :func:`sqrt_ggn_mc`.
        ValueError: as :func:`sqrt_ggn_mc`.

    Example:
        >>> model = torch.nn.Linear(4, 1)
        >>> loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.mse_loss)
        >>> params, buffers = sbfunc.split_module(model)
        >>> batch = (torch.randn(6, 4), torch.randn(6, 1))
        >>> from sbfunc.per_sample import diag_ggn_mc
        >>> est = diag_ggn_mc(loss_fn, mc_samples=8)(params, buffers, batch,
        ...                                          key=sbfunc.random.key(0))
        >>> est["weight"].shape, bool((est["weight"] >= 0).all())
        (torch.Size([1, 4]), True)

    References:
        Dangel et al. 2020, "BackPACK" (``DiagGGNMC``).
    """
    c = curvature(
        loss_fn, reduction=reduction, mc_samples=mc_samples, wrt=wrt, per_sample=per_sample
    )
    return transform(c, _diag, _sum)


def batch_diag_ggn_exact(
    loss_fn: Any,
    *,
    reduction: str = "mean",
    wrt: Sequence[str] | None = None,
    per_sample: PerSample = None,
) -> PerSampleTransform[Params]:
    """Per-sample GGN diagonals ``{name: Tensor[S, *shape]}``: row ``i`` is
    ``sum_c F[c, i]^2``, the diagonal of sample ``subsampling[i]``'s GGN term (BackPACK's
    ``BatchDiagGGNExact``, ``param.diag_ggn_exact_batch``, on any subset). Rows sum to
    :func:`diag_ggn_exact`.

    Args:
        loss_fn: the per-sample loss (as for :func:`sqrt_ggn_exact`).
        reduction: ``"mean"`` or ``"sum"`` (as for :func:`sqrt_ggn_exact`).
        wrt: parameter names or module prefixes (default: all).
        per_sample: which leaves of the batch are per-sample
            (:data:`sbfunc.types.PerSample`; default: inferred).

    Returns:
        ``f(params, buffers, batch, *, subsampling=None, chunk_size=None) -> dict``.

    Raises:
        TypeError: as :func:`sqrt_ggn_exact`.
        ValueError: as :func:`sqrt_ggn_exact`.

    Example:
        >>> model = torch.nn.Linear(4, 3)
        >>> loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy)
        >>> params, buffers = sbfunc.split_module(model)
        >>> batch = (torch.randn(6, 4), torch.randint(0, 3, (6,)))
        >>> from sbfunc.per_sample import batch_diag_ggn_exact, diag_ggn_exact
        >>> rows = batch_diag_ggn_exact(loss_fn)(params, buffers, batch, subsampling=[2, 0])
        >>> total = diag_ggn_exact(loss_fn)(params, buffers, batch, subsampling=[2, 0])
        >>> rows["bias"].shape, bool(torch.allclose(rows["bias"].sum(0), total["bias"]))
        (torch.Size([2, 3]), True)

    References:
        Dangel et al. 2020, "BackPACK" (``BatchDiagGGNExact``).
    """
    c = curvature(loss_fn, reduction=reduction, mc_samples=None, wrt=wrt, per_sample=per_sample)
    return transform(c, _batch_diag, _cat)


def batch_diag_ggn_mc(
    loss_fn: Any,
    *,
    mc_samples: int = 1,
    reduction: str = "mean",
    wrt: Sequence[str] | None = None,
    per_sample: PerSample = None,
) -> PerSampleTransform[Params]:
    """Monte-Carlo per-sample GGN diagonals ``{name: Tensor[S, *shape]}`` (BackPACK's
    ``BatchDiagGGNMC``, on any subset): row ``i`` is ``sum_m F[m, i]^2`` over
    :func:`sqrt_ggn_mc`'s factors.

    Args:
        loss_fn: the per-sample loss (as for :func:`sqrt_ggn_exact`).
        mc_samples: ``M >= 1``.
        reduction: ``"mean"`` or ``"sum"`` (as for :func:`sqrt_ggn_exact`).
        wrt: parameter names or module prefixes (default: all).
        per_sample: which leaves of the batch are per-sample
            (:data:`sbfunc.types.PerSample`; default: inferred).

    Returns:
        ``f(params, buffers, batch, *, key, subsampling=None, chunk_size=None) -> dict``.

    Raises:
        TypeError: as :func:`sqrt_ggn_mc`.
        ValueError: as :func:`sqrt_ggn_mc`.

    Example:
        >>> model = torch.nn.Linear(4, 3)
        >>> loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy)
        >>> params, buffers = sbfunc.split_module(model)
        >>> batch = (torch.randn(6, 4), torch.randint(0, 3, (6,)))
        >>> from sbfunc.per_sample import batch_diag_ggn_mc
        >>> f = batch_diag_ggn_mc(loss_fn, mc_samples=3)
        >>> f(params, buffers, batch, key=sbfunc.random.key(1), subsampling=[4])["weight"].shape
        torch.Size([1, 3, 4])

    References:
        Dangel et al. 2020, "BackPACK" (``BatchDiagGGNMC``).
    """
    c = curvature(
        loss_fn, reduction=reduction, mc_samples=mc_samples, wrt=wrt, per_sample=per_sample
    )
    return transform(c, _batch_diag, _cat)


def _check_vector(vector: Any, params: Params, names: list[str]) -> None:
    if not isinstance(vector, dict) or sorted(vector) != sorted(names):
        got = sorted(vector) if isinstance(vector, dict) else type(vector).__name__
        raise ValueError(f"vector must be a dict with the keys {names}, got {got}")
    for k in names:
        v = vector[k]
        if not isinstance(v, torch.Tensor) or v.shape != params[k].shape:
            what = tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
            raise ValueError(
                f"vector[{k!r}] must be a tensor of shape {tuple(params[k].shape)}, got {what}"
            )


def _gvp_chunk(
    c: Curvature, params: Params, buffers: Params, part: Chunk, names: list[str], vector: Params
) -> Params:
    diff = {k: params[k].detach().requires_grad_() for k in names}
    inputs = list(diff.values())
    with torch.enable_grad():
        with LayerRecorder({}, part.m):  # refuses train-mode BatchNorm (it couples samples)
            out = c.loss_fn.forward({**params, **diff}, buffers, part.batch)
        check_curvature_output(c, out, part.m)
        try:
            u = torch.zeros_like(out, requires_grad=True)
            jtu = torch.autograd.grad(out, inputs, u, create_graph=True, materialize_grads=True)
            (jv,) = torch.autograd.grad(
                jtu, u, [vector[k] for k in names], allow_unused=True, materialize_grads=True
            )
        except (RuntimeError, NotImplementedError):  # no double backward (fused attention)
            return _gvp_from_factors(c, params, buffers, part, names, vector)
        weight = element_weight(c.kind, out, part.n, c.reduction)
        hjv = hessian_vector(c.kind, out.detach(), weight, jv.detach())
        grads = torch.autograd.grad(out, inputs, hjv, materialize_grads=True)
    return dict(zip(names, grads, strict=True))


def _gvp_from_factors(
    c: Curvature, params: Params, buffers: Params, part: Chunk, names: list[str], vector: Params
) -> Params:
    """``sum_{r, n} F[r, n] <F[r, n], v>`` (first derivatives only)."""
    factors = next(factor_iter(c, params, buffers, names, [part], None))
    coef = sum(torch.einsum("rn...,...->rn", factors[k], vector[k]) for k in names)
    assert isinstance(coef, torch.Tensor)
    return {k: torch.einsum("rn,rn...->...", coef, factors[k]) for k in names}


def ggn_vector_product(
    loss_fn: Any,
    *,
    reduction: str = "mean",
    wrt: Sequence[str] | None = None,
    per_sample: PerSample = None,
) -> Any:
    """GGN-vector products on a subset: ``G_S v = sum_{i in S} J_i^T H_i J_i v``.

    No factors are formed: per chunk one forward, ``J v`` by the double-backward trick and one
    backward of ``H J v`` (memory of about two backwards, for any number of outputs). Where the
    model has no double backward (fused attention kernels), the chunk's product is
    ``sum F <F, v>`` over its exact factors instead. ``v`` and the result are dicts keyed like
    the differentiated parameters.

    Args:
        loss_fn: the per-sample loss (as for :func:`sqrt_ggn_exact`).
        reduction: ``"mean"`` or ``"sum"`` (as for :func:`sqrt_ggn_exact`).
        wrt: parameter names or module prefixes (default: all).
        per_sample: which leaves of the batch are per-sample
            (:data:`sbfunc.types.PerSample`; default: inferred).

    Returns:
        ``f(params, buffers, batch, vector, *, subsampling=None, chunk_size=None) -> dict``;
        ``vector`` must have the differentiated parameters' names and shapes (``ValueError``
        otherwise).

    Raises:
        TypeError: as :func:`sqrt_ggn_exact`.
        ValueError: as :func:`sqrt_ggn_exact`.

    Example:
        >>> model = torch.nn.Linear(4, 3)
        >>> loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy)
        >>> params, buffers = sbfunc.split_module(model)
        >>> batch = (torch.randn(6, 4), torch.randint(0, 3, (6,)))
        >>> from sbfunc.per_sample import ggn_vector_product, sqrt_ggn_exact
        >>> v = {k: torch.randn_like(p) for k, p in params.items()}
        >>> gv = ggn_vector_product(loss_fn)(params, buffers, batch, v, subsampling=[1, 4])
        >>> f = sqrt_ggn_exact(loss_fn)(params, buffers, batch, subsampling=[1, 4])
        >>> coef = sum(torch.einsum("cn...,...->cn", f[k], v[k]) for k in params)
        >>> bool(torch.allclose(gv["weight"], torch.einsum("cn,cnoi->oi", coef, f["weight"]),
        ...                     atol=1e-6))
        True

    References:
        Schraudolph 2002, "Fast curvature matrix-vector products for second-order gradient
        descent"; Martens 2010, "Deep learning via Hessian-free optimization".
    """
    c = curvature(loss_fn, reduction=reduction, mc_samples=None, wrt=wrt, per_sample=per_sample)

    def f(
        params: Params,
        buffers: Params,
        batch: Any,
        vector: Params,
        /,
        *,
        subsampling: Sequence[int] | torch.Tensor | None = None,
        chunk_size: int | None = None,
    ) -> Params:
        names, parts = chunks(c, params, buffers, batch, subsampling, chunk_size)
        _check_vector(vector, params, names)
        return _sum([_gvp_chunk(c, params, buffers, part, names, vector) for part in parts])

    return f
