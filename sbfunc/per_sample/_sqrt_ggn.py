"""Square-root factors of the generalized Gauss-Newton matrix on a subset: BackPACK's
``SqrtGGNExact`` and ``SqrtGGNMC`` as pure transforms.

The batch loss is ``L = sum_n w_n l(f_n)`` (``w_n = 1/N`` for a ``"mean"`` reduction over the
whole batch of ``N``, ``1`` for ``"sum"``) and its GGN is ``G = sum_n J_n^T H_n J_n``, with
``J_n`` the Jacobian of sample ``n``'s model output and ``H_n`` the Hessian of its weighted loss
with respect to that output. Any ``S_n`` with ``S_n S_n^T = H_n`` gives factors
``V_n = J_n^T S_n`` and ``G = sum_n V_n V_n^T``. The transforms return, per parameter, the
factors of the selected samples as ``[R, S, *param.shape]`` (BackPACK's layout): ``R = C``
(the number of outputs per sample) for the exact square root, ``R = M`` for ``M`` Monte-Carlo
samples (``E[S_n S_n^T] = H_n``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sbfunc.per_sample._factors import cat_factors, transform
from sbfunc.per_sample._request import curvature
from sbfunc.per_sample._transforms import PerSampleTransform
from sbfunc.types import Params, PerSample

__all__ = ["sqrt_ggn_exact", "sqrt_ggn_mc"]


def _identity(factors: Params) -> Params:
    return factors


def sqrt_ggn_exact(
    loss_fn: Any,
    *,
    reduction: str = "mean",
    wrt: Sequence[str] | None = None,
    per_sample: PerSample = None,
) -> PerSampleTransform[Params]:
    """Exact GGN square-root factors of the selected samples: ``{name: Tensor[C, S, *shape]}``.

    Entry ``[c, i]`` is ``J_n^T S_n[:, c]`` for ``n = subsampling[i]``, with ``S_n`` the
    symmetric-factor square root of the loss Hessian (cross-entropy:
    ``sqrt(w) (diag(sqrt p) - p sqrt(p)^T)``; MSE: ``sqrt(2 w) I``; BCE with logits:
    ``sqrt(w s (1 - s))``), so that ``GGN = sum_{c, i} vec(F[c, i]) vec(F[c, i])^T`` over the
    selected samples. ``C`` is the number of outputs per sample (``prod(out.shape[1:])``). With
    ``reduction="mean"`` the weight ``w`` divides by the size ``N`` of the whole batch (also
    when sub-sampling, as BackPACK does) and by the loss elements per sample, as torch's
    ``reduction="mean"`` does; ``"sum"`` is torch's ``reduction="sum"``.

    Linear and Conv weights and biases come from one forward and one backward of all ``C``
    columns at once; other parameters (LayerNorm, Embedding, attention, BatchNorm in eval
    mode, ...) from ``vmap`` over the samples of the linearized loss.

    Args:
        loss_fn: a :class:`~sbfunc.module.ModuleLoss` from :func:`sbfunc.per_sample_loss` with
            cross-entropy, MSE or binary cross-entropy with logits as criterion; its samples
            must not interact (no train-mode BatchNorm).
        reduction: ``"mean"`` or ``"sum"``: how the batch loss whose GGN is taken reduces the
            loss elements (as the criterion's own ``reduction`` argument would).
        wrt: parameter names or module prefixes (default: all).
        per_sample: which leaves of the batch are per-sample
            (:data:`sbfunc.types.PerSample`; default: inferred).

    Returns:
        ``f(params, buffers, batch, *, subsampling=None, chunk_size=None) -> dict``.

    Raises:
        TypeError: if ``loss_fn`` is not a ``ModuleLoss``; for a malformed ``wrt`` or
            ``per_sample``. Calls raise ``ValueError`` for bad indices or ``chunk_size``,
            unknown ``wrt`` names and train-mode BatchNorm.
        ValueError: for an unsupported criterion (the message lists the supported ones) or
            reduction.

    Example:
        >>> model = torch.nn.Linear(5, 3)
        >>> loss_fn = sbfunc.per_sample_loss(model, torch.nn.CrossEntropyLoss(reduction="none"))
        >>> params, buffers = sbfunc.split_module(model)
        >>> batch = (torch.randn(4, 5), torch.tensor([0, 2, 1, 1]))
        >>> from sbfunc.per_sample import sqrt_ggn_exact
        >>> factors = sqrt_ggn_exact(loss_fn)(params, buffers, batch, subsampling=[0, 3, 3])
        >>> factors["weight"].shape
        torch.Size([3, 3, 3, 5])
        >>> ggn = torch.einsum("cnp,cnq->pq", factors["bias"], factors["bias"])
        >>> bool(torch.allclose(ggn, ggn.T)), bool(torch.linalg.eigvalsh(ggn).min() > -1e-6)
        (True, True)

    References:
        Dangel et al. 2020, "BackPACK: Packing more into backprop" (``SqrtGGNExact``);
        Schraudolph 2002, "Fast curvature matrix-vector products for second-order gradient
        descent" (the GGN); Dangel et al. 2022, "ViViT".
    """
    c = curvature(loss_fn, reduction=reduction, mc_samples=None, wrt=wrt, per_sample=per_sample)
    return transform(c, _identity, cat_factors)


def sqrt_ggn_mc(
    loss_fn: Any,
    *,
    mc_samples: int = 1,
    reduction: str = "mean",
    wrt: Sequence[str] | None = None,
    per_sample: PerSample = None,
) -> PerSampleTransform[Params]:
    """Monte-Carlo GGN square-root factors: ``{name: Tensor[M, S, *shape]}``.

    As :func:`sqrt_ggn_exact` with ``S_n`` replaced by ``M`` sampled columns scaled by
    ``1/sqrt(M)``, each with ``E[v v^T] = H_n``: cross-entropy ``sqrt(w) (onehot(y~) - p)``
    with ``y~ ~ Categorical(p)``, MSE ``sqrt(2 w) eps`` with ``eps ~ N(0, I)``, BCE with
    logits ``sqrt(w) (b - s)`` with ``b ~ Bernoulli(s)``. So ``sum_{m, i} F F^T`` is an
    unbiased estimate of the GGN of the selected samples (the sampled Fisher for these
    losses), with ``M`` instead of ``C`` columns per sample. Draws come from ``key`` only:
    the same key gives the same factors (whatever ``chunk_size``), different keys independent
    ones; each position of ``subsampling`` (repeats too) gets its own draws.

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
        TypeError: as :func:`sqrt_ggn_exact`, and for an ``mc_samples`` that is not an int.
            Calls raise ``TypeError`` for a bad ``key``.
        ValueError: as :func:`sqrt_ggn_exact`, and for ``mc_samples < 1``.

    Example:
        >>> model = torch.nn.Linear(5, 3)
        >>> loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy)
        >>> params, buffers = sbfunc.split_module(model)
        >>> batch = (torch.randn(4, 5), torch.tensor([0, 2, 1, 1]))
        >>> from sbfunc.per_sample import sqrt_ggn_mc
        >>> f = sqrt_ggn_mc(loss_fn, mc_samples=2)
        >>> a = f(params, buffers, batch, key=sbfunc.random.key(0), subsampling=[0, 3, 3])
        >>> b = f(params, buffers, batch, key=sbfunc.random.key(0), subsampling=[0, 3, 3],
        ...       chunk_size=1)
        >>> a["weight"].shape, bool(torch.equal(a["weight"], b["weight"]))
        (torch.Size([2, 3, 3, 5]), True)

    References:
        Dangel et al. 2020, "BackPACK" (``SqrtGGNMC``); Martens 2014, "New insights and
        perspectives on the natural gradient method" (the sampled Fisher).
    """
    c = curvature(
        loss_fn, reduction=reduction, mc_samples=mc_samples, wrt=wrt, per_sample=per_sample
    )
    return transform(c, _identity, cat_factors)
