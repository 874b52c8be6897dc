"""Katharopoulos & Fleuret's importance sampling by the logits-gradient norm."""

from __future__ import annotations

from typing import NamedTuple

import torch

from sbfunc import random as sbrandom
from sbfunc.policies._base import Policy, SelectArgs, as_scores, make_policy
from sbfunc.select import Selection, check_keep, kept_count, random_indices
from sbfunc.types import Device
from sbfunc.validation import check_fraction, check_int

__all__ = [
    "ImportanceState",
    "grad_norm_importance",
    "logit_grad_norm",
    "tau_threshold",
    "variance_reduction",
]


class ImportanceState(NamedTuple):
    """The state of :func:`grad_norm_importance`.

    Attributes:
        tau: 0-d float tensor, the running estimate of the variance reduction.

    Example:
        >>> from sbfunc.policies import grad_norm_importance
        >>> grad_norm_importance(0.5).init()
        ImportanceState(tau=tensor(0.))

    References:
        Katharopoulos & Fleuret 2018, Algorithm 1.
    """

    tau: torch.Tensor


def logit_grad_norm(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-sample norm of the cross-entropy gradient w.r.t. the logits,
    ``||softmax(z) - onehot(y)||``: an upper bound (up to a constant) on the norm of the
    per-sample parameter gradient, from the forward pass alone.

    Args:
        logits: ``Tensor[N, C]``.
        targets: ``int Tensor[N]`` class indices, or ``Tensor[N, C]`` target probabilities.

    Returns:
        A detached ``Tensor[N]``.

    Raises:
        ValueError: for mismatched shapes.

    Example:
        >>> from sbfunc.policies import logit_grad_norm
        >>> logit_grad_norm(torch.tensor([[0.0, 0.0], [10.0, -10.0]]), torch.tensor([0, 0]))
        tensor([0.7071, 0.0000])

    References:
        Katharopoulos & Fleuret 2018, "Not All Samples Are Created Equal: Deep Learning with
        Importance Sampling".
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [N, C], got shape {tuple(logits.shape)}")
    probs = torch.softmax(logits.detach(), dim=1)
    if targets.dtype.is_floating_point:
        if targets.shape != logits.shape:
            raise ValueError(
                f"soft targets must have the logits' shape {tuple(logits.shape)}, "
                f"got {tuple(targets.shape)}"
            )
        onehot = targets.detach().to(probs)
    else:
        if targets.shape != logits.shape[:1]:
            raise ValueError(
                f"class targets must have shape ({logits.shape[0]},), got {tuple(targets.shape)}"
            )
        onehot = torch.nn.functional.one_hot(targets, logits.shape[1]).to(probs)
    return torch.linalg.vector_norm(probs - onehot, dim=1)


def _sampling_probs(scores: torch.Tensor) -> torch.Tensor:
    """Scores normalised to a distribution: non-finite scores rank below every finite one
    (:mod:`sbfunc.select`), so they get no mass while a finite row has some; negative
    scores get none either. Uniform over the finite rows when no finite score is positive,
    uniform over all rows when none is finite."""
    s = scores.detach()
    finite = s.isfinite()
    s = torch.where(finite, s, 0.0).clamp_min(0)
    total = s.sum()
    candidates = torch.where(finite.any(), finite, True).to(s.dtype)
    uniform = candidates / candidates.sum()
    return torch.where(total > 0, s / total.clamp_min(torch.finfo(s.dtype).tiny), uniform)


def _reduction(g: torch.Tensor) -> torch.Tensor:
    return g.shape[0] * g.square().sum()


def variance_reduction(scores: torch.Tensor) -> torch.Tensor:
    """The paper's estimate of the variance reduction of importance sampling over uniform
    sampling, ``1 / (1 - ||g - u||^2 / ||g||^2)``, with ``g`` the scores normalised to a
    distribution and ``u`` the uniform one; it simplifies to ``N * sum(g_i^2)``, 1 for equal
    scores and ``N`` when one sample holds all the mass.

    Args:
        scores: ``Tensor[N]`` of non-negative importance scores (integer scores count as
            floats).

    Returns:
        A 0-d tensor.

    Raises:
        TypeError, ValueError: for scores that are not a 1-D tensor (see
            :func:`~sbfunc.policies.check_scores`).

    Example:
        >>> from sbfunc.policies import variance_reduction
        >>> [variance_reduction(torch.tensor(s)) for s in ([1.0, 1.0], [1.0, 0.0])]
        [tensor(1.), tensor(2.)]

    References:
        Katharopoulos & Fleuret 2018, Algorithm 1 (the ``tau`` update).
    """
    scores = as_scores(scores)
    if scores.shape[0] == 0:  # nothing to sample: no reduction
        return torch.ones((), dtype=scores.dtype, device=scores.device)
    return _reduction(_sampling_probs(scores))


def tau_threshold(presample: int, batch: int) -> float:
    """The switch-on threshold ``tau_th = (B + 3b) / (3b)``: importance sampling a batch of
    ``b`` from a presample of ``B`` costs about ``B`` forwards more, which pays off only when
    the variance reduction exceeds ``tau_th``.

    Args:
        presample: ``B``, the presample size, >= ``batch``.
        batch: ``b``, the backpropagated batch size, >= 1.

    Raises:
        TypeError: for a ``batch`` or ``presample`` that is not an int.
        ValueError: for ``batch < 1`` or ``presample < batch``.

    Example:
        >>> from sbfunc.policies import tau_threshold
        >>> tau_threshold(384, 128)
        2.0

    References:
        Katharopoulos & Fleuret 2018, Algorithm 1.
    """
    check_int(batch, "batch", low=1)
    check_int(presample, "presample", low=batch, fix="the presample includes the batch")
    return (presample + 3 * batch) / (3 * batch)


def grad_norm_importance(
    keep: float,
    *,
    smoothing: float = 0.9,
    switch: bool = True,
    fixed_size: bool = False,
    device: Device = None,
) -> Policy:
    """Importance sampling proportional to the scores (the logits-gradient norm, see
    :func:`logit_grad_norm`) with unbiased weights, switched on by the variance reduction.

    The batch of ``N`` is the presample ``B``; ``k = max(1, floor(keep*N))`` rows are drawn
    **with replacement** with ``p_i = s_i / sum(s)``. A row drawn ``c_i`` times out of ``k``
    appears once with weight ``(u/k) * c_i / (N p_i)`` (``u`` distinct rows), so the mean of
    ``w * L`` over the kept rows equals ``(1/k) * sum_draws L / (N p)``, an unbiased estimate of
    the full-batch mean loss. Non-finite scores rank below every finite one
    (:mod:`sbfunc.select`): they get no probability mass, and the uniform draw prefers
    finite rows too. With ``switch=True`` the state
    keeps an exponential moving
    average ``tau`` of :func:`variance_reduction`; while ``tau <= tau_threshold(N, k)`` (it
    starts at 0) the policy draws a uniform subset of ``k`` rows with unit weights instead.

    Args:
        keep: fraction of draws per batch, in (0, 1].
        smoothing: the moving-average factor ``a_tau`` of ``tau``, in [0, 1).
        switch: use the ``tau`` switch; ``False`` always importance-samples.
        fixed_size: keep exactly ``k`` rows, the ``u`` distinct drawn rows first, then
            finite undrawn rows with weight 0 (the same estimate; a static shape: no host
            read of ``u`` and one compiled graph), instead of the ``u`` drawn rows.
        device: where the state starts (it follows the scores' device).

    Raises:
        ValueError, TypeError: for arguments outside those ranges.

    Example:
        >>> from sbfunc.policies import grad_norm_importance
        >>> policy = grad_norm_importance(0.5, switch=False)
        >>> scores = torch.tensor([0.0, 1.0, 0.0, 1.0])
        >>> sel, state = policy.select(scores, policy.init(), key=sbfunc.random.key(2))
        >>> sel.indices, sel.weights  # row 3 drawn twice: one row of weight (1/2) * 2 / (4 p_3)
        (tensor([3]), tensor([0.5000]))

    References:
        Katharopoulos & Fleuret 2018, "Not All Samples Are Created Equal: Deep Learning with
        Importance Sampling".
    """
    keep = check_keep(keep)
    smoothing = check_fraction(smoothing, "smoothing", open_high=True)
    for name, flag in (("switch", switch), ("fixed_size", fixed_size)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {flag!r}")

    def init() -> ImportanceState:
        return ImportanceState(torch.zeros((), device=device))

    def rule(
        scores: torch.Tensor, state: ImportanceState, a: SelectArgs
    ) -> tuple[Selection, ImportanceState]:
        n = scores.shape[0]
        k = kept_count(n, keep)
        draw_key, uniform_key = sbrandom.split(a.key)
        p = _sampling_probs(scores)
        draws = sbrandom.categorical(draw_key, p, k)
        counts = torch.zeros_like(p).scatter_add(0, draws, torch.ones_like(draws, dtype=p.dtype))
        factor = 1.0 / (n * p)
        tau = state.tau.to(p)
        if switch:
            use = tau > tau_threshold(n, k)
            u = sbrandom.uniform(uniform_key, (n,), device=scores.device)
            subset = random_indices(scores, k, u)
            uniform = torch.zeros_like(p).index_fill_(0, subset, 1.0)
            counts = torch.where(use, counts, uniform)
            factor = torch.where(use, factor, torch.ones_like(p))
        if fixed_size:  # drawn rows first, then finite ones, then by position; weight 0
            rank = 2 * (counts > 0).to(torch.uint8) + scores.isfinite().to(torch.uint8)
            kept = torch.argsort(rank, descending=True, stable=True)[:k].sort().values
            weights = torch.where(counts > 0, counts * factor, 0.0).index_select(0, kept)
        else:
            kept = counts.nonzero().reshape(-1)  # variable size: a read of the kept count
            weights = (kept.shape[0] / k) * (counts * factor).index_select(0, kept)
        tau = smoothing * tau + (1 - smoothing) * _reduction(p)
        return Selection(kept, weights), ImportanceState(tau.to(state.tau))

    return make_policy(init, rule)
