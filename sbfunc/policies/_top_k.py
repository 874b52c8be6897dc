"""The stateless fixed-count controls: the top-k scores (:func:`top_k`) and a uniformly random
subset (:func:`random_subset`)."""

from __future__ import annotations

import torch

from sbfunc import random as sbrandom
from sbfunc.policies._base import Policy, stateless
from sbfunc.select import Selection, check_keep, kept_count, random_indices, top_k_indices

__all__ = ["random_subset", "top_k", "top_k_selection"]


def top_k(keep: float) -> Policy:
    """The ``k = max(1, floor(keep*N))`` highest scores, ties broken at random by the key.

    Non-finite scores rank below every finite one (:mod:`sbfunc.select`): they are kept
    only when fewer than ``k`` scores are finite. Stateless; ``weights=None``.

    Args:
        keep: fraction kept, in (0, 1].

    Returns:
        A :class:`~sbfunc.policies.Policy`.

    Raises:
        TypeError: for ``keep`` not a number.
        ValueError: for ``keep`` outside (0, 1].

    Example:
        >>> from sbfunc.policies import top_k
        >>> policy = top_k(0.5)
        >>> scores = torch.tensor([0.1, float("nan"), 0.3, 5.0])
        >>> policy.select(scores, policy.init(), key=sbfunc.random.key(0))[0].indices
        tensor([2, 3])

    References:
        Mindermann et al. 2022, "Prioritized Training on Points that are Learnable, Worth
        Learning, and Not Yet Learnt" (top-k by a per-sample score).
    """
    keep = check_keep(keep)
    return stateless(lambda scores, key, ids: top_k_selection(scores, keep, key))


def top_k_selection(scores: torch.Tensor, keep: float, key: sbrandom.Key) -> Selection:
    """The top-``keep`` fraction of ``scores``, ties broken by ``key`` (:func:`top_k`'s rule)."""
    tie_noise = sbrandom.bits(key, (scores.shape[0],), device=scores.device)
    return Selection(top_k_indices(scores, kept_count(scores.shape[0], keep), tie_noise))


def random_subset(keep: float) -> Policy:
    """A uniformly random subset of ``k = max(1, floor(keep*N))`` rows, whatever their
    scores: the control for any selection study.

    Rows with a non-finite score are kept only when fewer than ``k`` are finite (the rule of
    :mod:`sbfunc.select`); among the finite rows the draw is uniform. The plain mean over
    the kept rows is an unbiased estimate of the full-batch mean, so ``weights=None``.

    Args:
        keep: fraction kept, in (0, 1].

    Returns:
        A :class:`~sbfunc.policies.Policy`.

    Raises:
        TypeError: for ``keep`` not a number.
        ValueError: for ``keep`` outside (0, 1].

    Example:
        >>> from sbfunc.policies import random_subset
        >>> policy = random_subset(0.3)
        >>> policy.select(torch.zeros(10), policy.init(), key=sbfunc.random.key(0))[0].indices
        tensor([0, 1, 8])

    References:
        Jiang et al. 2019 (the random-subset baseline).
    """
    keep = check_keep(keep)

    def rule(scores: torch.Tensor, key: sbrandom.Key, ids: torch.Tensor | None) -> Selection:
        u = sbrandom.uniform(key, (scores.shape[0],), device=scores.device)
        return Selection(random_indices(scores, kept_count(scores.shape[0], keep), u))

    return stateless(rule)
