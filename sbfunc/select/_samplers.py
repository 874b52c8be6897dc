"""The sampling maths of the fixed-count selection rules: Gumbel-top-k, Composer's rank-power
weights, and the index draws the policies of :mod:`sbfunc.policies` are built from.

Every draw here follows the non-finite rule of :mod:`sbfunc.select`: rows with a
non-finite score (or log-weight) come after every finite one, in a random order.
"""

from __future__ import annotations

import array
import sys

import torch

from sbfunc._tracing import host_readable
from sbfunc.select._base import (
    ascending_lowest,
    distinct_order,
    finite_entries,
    finite_split,
)

__all__ = ["gumbel_top_k", "perturbed", "random_indices", "sorted_unique", "top_k_indices"]

_LITTLE = sys.byteorder == "little"  # torch.frombuffer reads native int64


def sorted_unique(indices: torch.Tensor, n: int) -> torch.Tensor:
    """``indices``, unique indices into ``[0, n)``, in ascending order. Compiled: a mask and
    its nonzero entries, which fuse into cheaper kernels than a sort; ``nonzero_static`` keeps
    the shape static (no sync, no graph break). Eagerly, where every op is a kernel launch:
    one sort instead of those five ops (the same values, the indices being unique), and on
    the CPU a sort of the Python ints (no tensor op: ``torch.frombuffer``)."""
    if _LITTLE and indices.dtype == torch.int64 and indices.shape[0] and host_readable(indices):
        return torch.frombuffer(array.array("q", sorted(indices.tolist())), dtype=torch.int64)
    if not torch.compiler.is_compiling():
        return torch.sort(indices).values
    mask = torch.zeros(n, dtype=torch.bool, device=indices.device)
    mask[indices] = True
    return torch.nonzero_static(mask, size=indices.shape[0]).reshape(-1)


def perturbed(
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
    keys = perturbed(log_weights, gumbel)
    return sorted_unique(torch.topk(keys, k, sorted=False).indices, gumbel.shape[0])


def top_k_indices(scores: torch.Tensor, k: int, tie_noise: torch.Tensor | None) -> torch.Tensor:
    """The ``k`` highest finite scores (then non-finite ones, to fill ``k``), ties broken by
    ``tie_noise`` (by position when ``None``), as sorted indices."""
    n = scores.shape[0]
    order = distinct_order(scores)  # eagerly, finite and distinct: the top k are unique
    if order is not None:
        return sorted_unique(order[n - k :], n)
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
        if not (host_readable(finite) and bool(finite.all())):  # eagerly: skip a no-op select
            u = torch.where(finite, u, u - 1.0)
    return sorted_unique(torch.topk(u, k, sorted=False).indices, scores.shape[0])
