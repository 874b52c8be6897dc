"""The sampling maths of the fixed-count selection rules: Gumbel-top-k, Composer's rank-power
weights, and the index draws the policies of :mod:`sbfunc.policies` are built from.

Every draw here follows the non-finite rule of :mod:`sbfunc.select.base`: rows with a
non-finite score (or log-weight) come after every finite one, in a random order.
"""

from __future__ import annotations

import functools

import torch

from sbfunc import random as sbrandom
from sbfunc.random._threefry import host_words
from sbfunc.select.base import (
    ascending_lowest,
    check_keep,
    finite_entries,
    finite_split,
    kept_count,
)

__all__ = ["gumbel_top_k", "rank_power_log_weights"]


def sorted_unique(indices: torch.Tensor, n: int) -> torch.Tensor:
    """``indices``, unique indices into ``[0, n)``, in ascending order. Compiled: a mask and
    its nonzero entries, which fuse into cheaper kernels than a sort; ``nonzero_static`` keeps
    the shape static (no sync, no graph break). Eagerly, where every op is a kernel launch:
    one sort instead of those five ops (the same values, the indices being unique)."""
    if not torch.compiler.is_compiling():
        return torch.sort(indices).values
    mask = torch.zeros(n, dtype=torch.bool, device=indices.device)
    mask[indices] = True
    return torch.nonzero_static(mask, size=indices.shape[0]).reshape(-1)


def _perturbed(
    log_weights: torch.Tensor, gumbel: torch.Tensor, ok: torch.Tensor | None = None
) -> torch.Tensor:
    """``log_weights + gumbel``, with the rows of non-finite log-weight placed below every
    other row and ordered among themselves by their noise alone; ``ok``: the rows of finite
    log-weight, when the caller knows them (otherwise read from ``log_weights``)."""
    drawn = log_weights + gumbel
    ok = finite_entries(log_weights) if ok is None else ok
    lowest = torch.where(ok, drawn, torch.inf).amin()
    lowest = torch.where(ok.any(), lowest, 0.0)
    return torch.where(ok, drawn, lowest - 1.0 - (gumbel.amax() - gumbel))


def gumbel_top_k(log_weights: torch.Tensor, k: int, gumbel: torch.Tensor) -> torch.Tensor:
    """Draw ``k`` indices without replacement with probabilities proportional to
    ``exp(log_weights)``, by the Gumbel-top-k trick; returns them sorted ascending.

    The ``k`` largest of ``log_weights + G`` (``G`` i.i.d. standard Gumbel) have the same law as
    ``k`` sequential weighted draws without replacement (Kool et al. 2019), and need one
    ``topk`` on the device instead of ``k`` host round-trips. Rows whose log-weight is not
    finite (``-inf``, NaN) are drawn only when fewer than ``k`` rows have a finite one, then
    uniformly among themselves.

    Args:
        log_weights: ``Tensor[N]`` of unnormalised log-probabilities.
        k: number of draws, ``1 <= k <= N``.
        gumbel: ``Tensor[N]`` of standard Gumbel noise (see :func:`sbfunc.random.gumbel`).

    Returns:
        ``int64 Tensor[k]`` of unique indices, ascending.

    Example:
        >>> g = sbfunc.random.gumbel(sbfunc.random.key(0), (5,))
        >>> sbfunc.select.gumbel_top_k(torch.zeros(5), 2, g).shape
        torch.Size([2])

    References:
        Kool, van Hoof and Welling 2019, "Stochastic Beams and Where to Find Them".
    """
    keys = _perturbed(log_weights, gumbel)
    return sorted_unique(torch.topk(keys, k, sorted=False).indices, gumbel.shape[0])


def rank_power_log_weights(rank: torch.Tensor, keep: float) -> torch.Tensor:
    """Composer's selection weights in log space: ``(1/keep - 1) * log((rank + 0.5) / N)``.

    Args:
        rank: ``Tensor[N]`` of ranks, 0 for the lowest score.
        keep: the kept fraction, in (0, 1].

    Returns:
        A float32 ``Tensor[N]``.

    Example:
        >>> sbfunc.select.rank_power_log_weights(torch.tensor([0, 1]), 0.5).exp()
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
        >>> sbfunc.select.samplers.rank_power_indices(
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
        if host_words(gumbel):
            return _host_log_weights(n, keep) + gumbel
        return rank_power_log_weights(torch.arange(n, device=gumbel.device), keep) + gumbel
    position = torch.arange(n, device=gumbel.device)
    log_w = rank_power_log_weights(position, keep)
    if finite_weights:  # the first `nonfinite` positions are exactly the -inf log-weights
        return _perturbed(log_w, gumbel, position >= nonfinite)
    return _perturbed(torch.where(position < nonfinite, -torch.inf, log_w), gumbel)


@functools.lru_cache(maxsize=16)
def _host_log_weights(n: int, keep: float) -> torch.Tensor:
    """``rank_power_log_weights(arange(n), keep)`` on the CPU, made once per ``(n, keep)``: a
    constant of the draw, six ops a step otherwise. Only read, never handed out."""
    return rank_power_log_weights(torch.arange(n, device="cpu"), keep)


def top_k_indices(scores: torch.Tensor, k: int, tie_noise: torch.Tensor | None) -> torch.Tensor:
    """The ``k`` highest finite scores (then non-finite ones, to fill ``k``), ties broken by
    ``tie_noise`` (by position when ``None``), as sorted indices."""
    n = scores.shape[0]
    lowest, nonfinite = finite_split(-scores)
    order = ascending_lowest(lowest, tie_noise)  # non-finite first, then the highest scores
    if not isinstance(nonfinite, int):  # skip the non-finite rows (then wrap around to them)
        order = order[(torch.arange(n, device=scores.device) + nonfinite) % max(n, 1)]
    return sorted_unique(order[:k], n)


def random_indices(scores: torch.Tensor, k: int, u: torch.Tensor) -> torch.Tensor:
    """A uniformly random ``k`` of the rows with a finite score (then of the others, to fill
    ``k``), from uniform noise ``u``, as sorted indices."""
    if scores.dtype.is_floating_point:
        finite = finite_entries(scores)
        if not (host_words(finite) and bool(finite.all())):  # eagerly: skip a no-op select
            u = torch.where(finite, u, u - 1.0)
    return sorted_unique(torch.topk(u, k, sorted=False).indices, scores.shape[0])
