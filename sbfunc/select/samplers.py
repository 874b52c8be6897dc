"""Selection rules: pure functions from per-sample scores to a :class:`Selection`."""

from __future__ import annotations

import torch

from sbfunc import random as sbrandom
from sbfunc.select.base import Selection, ascending_order, check_keep, kept_count, nan_as_inf
from sbfunc.validation import check_tensor

__all__ = [
    "gumbel_top_k",
    "random_subset",
    "rank_power",
    "rank_power_indices",
    "rank_power_log_weights",
    "top_k",
]


def _check_scores(scores: torch.Tensor) -> int:
    check_tensor(scores, "scores", dim=1, fix="pass one score per row, a Tensor[N]")
    return scores.shape[0]


def _empty(scores: torch.Tensor) -> Selection:
    """The selection of an empty batch: no row."""
    return Selection(torch.zeros(0, dtype=torch.int64, device=scores.device))


def _sorted(indices: torch.Tensor, n: int) -> torch.Tensor:
    """Unique indices into ``[0, n)`` in ascending order: a mask and its nonzero entries, which
    is cheaper than a sort; ``nonzero_static`` keeps the shape static (no sync, no graph
    break under ``torch.compile``)."""
    mask = torch.zeros(n, dtype=torch.bool, device=indices.device)
    mask[indices] = True
    return torch.nonzero_static(mask, size=indices.shape[0]).reshape(-1)


def gumbel_top_k(log_weights: torch.Tensor, k: int, gumbel: torch.Tensor) -> torch.Tensor:
    """Draw ``k`` indices without replacement with probabilities proportional to
    ``exp(log_weights)``, by the Gumbel-top-k trick; returns them sorted ascending.

    The ``k`` largest of ``log_weights + G`` (``G`` i.i.d. standard Gumbel) have the same law as
    ``k`` sequential weighted draws without replacement (Kool et al. 2019), and need one
    ``topk`` on the device instead of ``k`` host round-trips.

    Args:
        log_weights: ``Tensor[N]`` of unnormalised log-probabilities (``-inf`` never drawn).
        k: number of draws, ``1 <= k <= N``.
        gumbel: ``Tensor[N]`` of standard Gumbel noise (see :func:`sbfunc.random.gumbel`).

    Example:
        >>> g = sbfunc.random.gumbel(sbfunc.random.key(0), (5,))
        >>> sbfunc.gumbel_top_k(torch.zeros(5), 2, g).shape
        torch.Size([2])

    References:
        Kool, van Hoof and Welling 2019, "Stochastic Beams and Where to Find Them".
    """
    return _sorted(torch.topk(log_weights + gumbel, k, sorted=False).indices, gumbel.shape[0])


def rank_power_log_weights(rank: torch.Tensor, keep: float) -> torch.Tensor:
    """Composer's selection weights in log space: ``(1/keep - 1) * log((rank + 0.5) / N)``.

    Example:
        >>> sbfunc.rank_power_log_weights(torch.tensor([0, 1]), 0.5).exp()
        tensor([0.2500, 0.7500])

    References:
        Jiang et al. 2019, "Accelerating Deep Learning by Focusing on the Biggest Losers";
        MosaicML Composer ``select_using_loss`` (``percs ** (1/keep - 1)``).
    """
    check_keep(keep)
    n = rank.shape[0]
    return (1.0 / keep - 1.0) * torch.log((rank.to(torch.float32) + 0.5) / n)


def rank_power(scores: torch.Tensor, keep: float, *, key: sbrandom.Key) -> Selection:
    """Composer/Jiang selection: sample ``max(1, floor(keep*N))`` rows without replacement,
    rank ``r`` (0 = lowest score) weighted ``((r + 0.5) / N) ** (1/keep - 1)``.

    Same law as Composer's ``np.random.choice(N, k, replace=False, p=w/sum(w))`` but drawn on
    the scores' device with Gumbel-top-k, from an explicit key, ties in ``scores`` broken
    uniformly at random, and the indices returned sorted. Depends on scores only through their
    ranks, so any strictly increasing transform of the scores gives the same selection.

    Args:
        scores: ``Tensor[N]``, higher means more useful to backpropagate (e.g. the loss).
        keep: fraction in (0, 1]; ``keep=1`` keeps every row.
        key: an :mod:`sbfunc.random` key.

    Returns:
        A :class:`Selection` with ``weights=None``; empty for ``N = 0``.

    Raises:
        TypeError: if ``scores`` is not a tensor (or ``keep`` not a number).
        ValueError: if ``scores`` is not 1-D, or ``keep`` is not in (0, 1].

    Example:
        >>> losses = torch.tensor([0.1, 2.0, 0.3, 5.0])
        >>> sbfunc.rank_power(losses, 0.5, key=sbfunc.random.key(0)).indices
        tensor([1, 3])

    References:
        Jiang et al. 2019, "Accelerating Deep Learning by Focusing on the Biggest Losers";
        MosaicML Composer, ``composer.algorithms.selective_backprop.select_using_loss``.
    """
    n = _check_scores(scores)
    if n == 0:
        return _empty(scores)
    tie_key, draw_key = sbrandom.split(key)
    tie_noise = sbrandom.bits(tie_key, (n,), device=scores.device)
    u = sbrandom.uniform(draw_key, (n,), device=scores.device)
    return Selection(rank_power_indices(scores, keep, tie_noise, u))


def rank_power_indices(
    scores: torch.Tensor, keep: float, tie_noise: torch.Tensor, u: torch.Tensor
) -> torch.Tensor:
    """The sorted indices :func:`rank_power` draws, from given noise: ``tie_noise`` (int64
    ``Tensor[N]`` of i.i.d. values in ``[0, 2**32)``) breaks ties and ``u`` (uniform
    ``Tensor[N]`` in ``[0, 1)``) drives the Gumbel-top-k draw. Shared by :func:`rank_power`
    (noise from a key) and the Composer-compatible ``select_using_loss`` (noise from a
    ``torch.Generator``).

    Example:
        >>> scores = torch.tensor([0.1, 2.0, 0.3, 5.0])
        >>> sbfunc.select.rank_power_indices(scores, 0.5, torch.zeros(4, dtype=torch.long),
        ...                                  torch.full((4,), 0.5))
        tensor([1, 3])
    """
    n = scores.shape[0]
    k = kept_count(n, keep)
    dev = scores.device
    # In sorted order position j has rank j: draw positions there (the Gumbel noise is i.i.d.,
    # so which row carries which draw does not change the law) and map them back.
    order = ascending_order(scores, tie_noise)
    log_w = rank_power_log_weights(torch.arange(n, device=dev), keep)
    positions = torch.topk(log_w + sbrandom.gumbel_from_uniform(u), k, sorted=False).indices
    return _sorted(order[positions], n)


def top_k(scores: torch.Tensor, keep: float, *, key: sbrandom.Key | None = None) -> Selection:
    """Deterministic selection of the ``max(1, floor(keep*N))`` highest scores.

    NaN scores count as ``+inf`` (see :mod:`sbfunc.select.base`): they are kept first.

    Args:
        scores: ``Tensor[N]``.
        keep: fraction in (0, 1].
        key: optional key to break ties uniformly at random; without one, among equal scores
            the lower index wins.

    Returns:
        A :class:`Selection` with ``weights=None``; empty for ``N = 0``.

    Raises:
        TypeError: if ``scores`` is not a tensor (or ``keep`` not a number).
        ValueError: if ``scores`` is not 1-D, or ``keep`` is not in (0, 1].

    Example:
        >>> sbfunc.top_k(torch.tensor([0.1, 2.0, 0.3, 5.0]), 0.5).indices
        tensor([1, 3])
        >>> sbfunc.top_k(torch.tensor([0.1, float("nan"), 0.3, 5.0]), 0.5).indices
        tensor([1, 3])

    References:
        Mindermann et al. 2022, "Prioritized Training on Points that are Learnable, Worth
        Learning, and Not Yet Learnt" (top-k by a score).
    """
    n = _check_scores(scores)
    k = kept_count(n, check_keep(keep))
    if n == 0:
        return _empty(scores)
    tie_noise = None if key is None else sbrandom.bits(key, (n,), device=scores.device)
    order = ascending_order(-nan_as_inf(scores), tie_noise)  # highest score (or NaN) first
    return Selection(_sorted(order[:k], n))


def random_subset(scores: torch.Tensor, keep: float, *, key: sbrandom.Key) -> Selection:
    """Uniformly random subset of ``max(1, floor(keep*N))`` rows (ignores the score values):
    the control for any selection study; empty for ``N = 0``.

    Raises:
        TypeError: if ``scores`` is not a tensor (or ``keep`` not a number).
        ValueError: if ``scores`` is not 1-D, or ``keep`` is not in (0, 1].

    Example:
        >>> sbfunc.random_subset(torch.zeros(10), 0.3, key=sbfunc.random.key(0)).indices.shape
        torch.Size([3])

    References:
        Jiang et al. 2019 (the random-subset baseline).
    """
    n = _check_scores(scores)
    k = kept_count(n, check_keep(keep))
    if n == 0:
        return _empty(scores)
    u = sbrandom.uniform(key, (n,), device=scores.device)
    return Selection(_sorted(torch.topk(u, k, sorted=False).indices, n))
