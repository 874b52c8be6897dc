"""Composer's Selective Backprop rule: rank-power sampling (:func:`rank_power`) and its maths."""

from __future__ import annotations

import functools

import torch

from sbfunc import random as sbrandom
from sbfunc._tracing import host_readable
from sbfunc.policies._base import Policy, stateless
from sbfunc.select import (
    Selection,
    ascending_lowest,
    check_keep,
    distinct_order,
    finite_split,
    kept_count,
    perturbed,
    sorted_unique,
)

__all__ = ["rank_power", "rank_power_indices", "rank_power_log_weights"]


def rank_power(keep: float) -> Policy:
    """Composer's Selective Backprop law: sample ``k = max(1, floor(keep*N))`` rows without
    replacement, rank ``r`` (0 = lowest score) weighted ``((r + 0.5) / N) ** (1/keep - 1)``.

    Same law as Composer's ``np.random.choice(N, k, replace=False, p=w/sum(w))`` but drawn on
    the scores' device with Gumbel-top-k, from an explicit key, ties in the scores broken
    uniformly at random, and the indices returned sorted. Depends on the scores only through
    their ranks, so any strictly increasing transform of the scores gives the same selection.
    Non-finite scores rank below every finite one with weight 0 (:mod:`sbfunc.select`):
    they are kept only when fewer than ``k`` scores are finite. Stateless
    (:class:`~sbfunc.types.EmptyState`); ``weights=None`` (biased towards high loss on
    purpose); ``keep=1`` keeps every row. The tie-breaking noise is ``bits(split(key)[0], N)``
    and the Gumbel noise's uniform ``uniform(split(key)[1], N)``; eagerly on the CPU, while every
    score is finite and distinct, the tie noise cannot change the order and is not drawn (the
    same selection, bit for bit; :func:`~sbfunc.select.distinct_order`).

    Args:
        keep: fraction kept, in (0, 1].

    Returns:
        A :class:`~sbfunc.policies.Policy`.

    Raises:
        TypeError: for ``keep`` not a number; at ``select``, for scores that are not a tensor
            (integer and bool scores are accepted as floats,
            :func:`~sbfunc.policies.as_scores`).
        ValueError: for ``keep`` outside (0, 1]; at ``select``, for scores that are not 1-D.

    Example:
        >>> from sbfunc.policies import rank_power
        >>> policy = rank_power(0.5)
        >>> losses = torch.tensor([0.1, 2.0, 0.3, 5.0])
        >>> sel, state = policy.select(losses, policy.init(), key=sbfunc.random.key(0))
        >>> sel.indices, state
        (tensor([1, 3]), EmptyState())

    References:
        Jiang et al. 2019, "Accelerating Deep Learning by Focusing on the Biggest Losers";
        MosaicML Composer, ``composer.algorithms.selective_backprop.select_using_loss``.
    """
    keep = check_keep(keep)

    def rule(scores: torch.Tensor, key: sbrandom.Key, ids: torch.Tensor | None) -> Selection:
        n, device = scores.shape[0], scores.device
        # split(key)'s two children, each made when needed (fold_in(key, i) is split(key)[i])
        u = sbrandom.uniform(sbrandom.fold_in(key, 1), (n,), device=device)
        order = distinct_order(scores)  # eagerly: no tie can arise, so no tie noise is drawn
        if order is not None:
            return Selection(_draw(order, keep, u))
        tie_noise = sbrandom.bits(sbrandom.fold_in(key, 0), (n,), device=device)
        return Selection(rank_power_indices(scores, keep, tie_noise, u))

    return stateless(rule)


def rank_power_log_weights(rank: torch.Tensor, keep: float) -> torch.Tensor:
    """Composer's selection weights in log space: ``(1/keep - 1) * log((rank + 0.5) / N)``.

    Args:
        rank: ``Tensor[N]`` of ranks, 0 for the lowest score.
        keep: the kept fraction, in (0, 1].

    Returns:
        A float32 ``Tensor[N]``.

    Example:
        >>> sbfunc.policies.rank_power_log_weights(torch.tensor([0, 1]), 0.5).exp()
        tensor([0.2500, 0.7500])

    References:
        Jiang et al. 2019, "Accelerating Deep Learning by Focusing on the Biggest Losers";
        MosaicML Composer ``select_using_loss`` (``percs ** (1/keep - 1)``).
    """
    check_keep(keep)
    n = rank.shape[0]
    return (1.0 / keep - 1.0) * torch.log((rank.to(torch.float32) + 0.5) / n)


def rank_power_indices(
    scores: torch.Tensor, keep: float, tie_noise: torch.Tensor, u: torch.Tensor
) -> torch.Tensor:
    """The sorted indices :func:`sbfunc.policies.rank_power` draws, from given noise:
    ``tie_noise`` (int64 ``Tensor[N]`` of i.i.d. values in ``[0, 2**32)``) breaks ties and
    ``u`` (uniform ``Tensor[N]`` in ``[0, 1)``) drives the Gumbel-top-k draw. Shared by the
    policy (noise from a key) and the Composer-compatible ``select_using_loss`` (noise from a
    ``torch.Generator``). Non-finite scores take the lowest ranks with weight 0: drawn only to
    fill ``k`` when too few scores are finite.

    Example:
        >>> scores = torch.tensor([0.1, 2.0, 0.3, 5.0])
        >>> sbfunc.policies.rank_power_indices(
        ...     scores, 0.5, torch.zeros(4, dtype=torch.long), torch.full((4,), 0.5))
        tensor([1, 3])
    """
    n = scores.shape[0]
    # In sorted order position j has rank j: draw positions there (the Gumbel noise is i.i.d.,
    # so which row carries which draw does not change the law) and map them back. The
    # non-finite scores sort first; their weight is 0.
    lowest, nonfinite = finite_split(scores)
    order = ascending_lowest(lowest, tie_noise)
    keys = _rank_power_keys(n, keep, nonfinite, sbrandom.gumbel_from_uniform(u))
    return sorted_unique(order[torch.topk(keys, kept_count(n, keep), sorted=False).indices], n)


def _draw(order: torch.Tensor, keep: float, u: torch.Tensor) -> torch.Tensor:
    """:func:`rank_power_indices` for scores that are all finite and distinct, from their
    ascending ``order`` (:func:`~sbfunc.select.distinct_order`)."""
    n = order.shape[0]
    keys = _rank_power_keys(n, keep, 0, sbrandom.gumbel_from_uniform(u))
    positions = torch.topk(keys, kept_count(n, keep), sorted=False).indices
    return sorted_unique(order.index_select(0, positions), n)


# Below this exponent every rank-power log-weight is finite in float32: |log((r + 0.5) / N)| is
# at most log(2N) < 50 for any N below 2**70, and 1e36 * 50 < float32's max (3.4e38).
_FINITE_LOG_WEIGHTS = 1e36


def _rank_power_keys(
    n: int, keep: float, nonfinite: torch.Tensor | int, gumbel: torch.Tensor
) -> torch.Tensor:
    """The perturbed log-weights of the ``n`` sorted positions, the first ``nonfinite`` of
    which (the non-finite scores) have weight 0."""
    finite_weights = 1.0 / keep - 1.0 <= _FINITE_LOG_WEIGHTS
    if finite_weights and isinstance(nonfinite, int):  # every score finite: just add
        if host_readable(gumbel):
            return _host_log_weights(n, keep) + gumbel
        return rank_power_log_weights(torch.arange(n, device=gumbel.device), keep) + gumbel
    position = torch.arange(n, device=gumbel.device)
    log_w = rank_power_log_weights(position, keep)
    if finite_weights:  # the first `nonfinite` positions are exactly the -inf log-weights
        return perturbed(log_w, gumbel, position >= nonfinite)
    return perturbed(torch.where(position < nonfinite, -torch.inf, log_w), gumbel)


@functools.lru_cache(maxsize=16)
def _host_log_weights(n: int, keep: float) -> torch.Tensor:
    """``rank_power_log_weights(arange(n), keep)`` on the CPU, made once per ``(n, keep)``: a
    constant of the draw, six ops a step otherwise. Only read, never handed out."""
    return rank_power_log_weights(torch.arange(n, device="cpu"), keep)
