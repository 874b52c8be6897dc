"""The selection type, the kept count and rank computation shared by all selection rules."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import NamedTuple

import torch

from sbfunc import random as sbrandom

__all__ = ["Selection", "check_keep", "kept_count", "ranks"]


class Selection(NamedTuple):
    """The outcome of a selection rule.

    Attributes:
        indices: ``Tensor[k]`` of ``int64`` row indices, unique and sorted ascending (so the
            pruned batch keeps the original order), on the scores' device.
        weights: ``Tensor[k]`` of per-sample loss weights aligned with ``indices`` (importance
            weights of unbiased samplers), or ``None`` for an unweighted mean.
    """

    indices: torch.Tensor
    weights: torch.Tensor | None = None


def check_keep(keep: float) -> float:
    """Validate ``keep`` in (0, 1] and return it as a float.

    Example:
        >>> sbfunc.check_keep(0.25)
        0.25
    """
    if isinstance(keep, bool) or not isinstance(keep, int | float):
        raise TypeError(f"keep must be a float in (0, 1], got {keep!r}")
    if not (math.isfinite(keep) and 0 < keep <= 1):
        raise ValueError(f"keep must be in (0, 1], got {keep!r}")
    return float(keep)


def kept_count(n: int, keep: float) -> int:
    """Number of samples kept out of ``n``: ``max(1, floor(keep * n))``, computed exactly.

    ``keep`` is read as the decimal it prints as (``0.29`` is 29/100, not the binary float
    0.28999999999999998), so ``kept_count(100, 0.29) == 29`` where ``int(0.29 * 100)`` gives 28.

    Args:
        n: batch size, >= 1.
        keep: fraction in (0, 1].

    Example:
        >>> sbfunc.kept_count(100, 0.29), sbfunc.kept_count(1, 0.5), sbfunc.kept_count(7, 1.0)
        (29, 1, 7)
    """
    keep = check_keep(keep)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n (the batch size) must be an int >= 1, got {n!r}")
    return max(1, math.floor(Fraction(repr(keep)) * n))


def ranks(
    scores: torch.Tensor,
    *,
    key: sbrandom.Key | None = None,
    tie_noise: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rank of every score, 0 for the lowest, with ties broken uniformly at random.

    Ties are broken by a random permutation drawn from ``key`` (or from ``tie_noise``, a
    ``Tensor[N]`` of i.i.d. continuous noise); with neither, by position (stable sort). Runs on
    the scores' device without a host sync.

    Example:
        >>> sbfunc.ranks(torch.tensor([0.3, 0.1, 0.2]))
        tensor([2, 0, 1])
    """
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D [N], got shape {tuple(scores.shape)}")
    n = scores.shape[0]
    if key is not None:
        tie_noise = sbrandom.uniform(key, (n,), device=scores.device)
    if tie_noise is None:
        order = torch.argsort(scores, stable=True)
    else:
        perm = torch.argsort(tie_noise)
        order = perm[torch.argsort(scores[perm], stable=True)]
    out = torch.empty_like(order)
    out[order] = torch.arange(n, device=scores.device)
    return out
