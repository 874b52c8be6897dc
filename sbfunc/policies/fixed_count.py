"""Fixed-count policies: rank-power, top-k, random subset (stateless) and RHO-LOSS."""

from __future__ import annotations

from typing import NamedTuple

import torch

from sbfunc import random as sbrandom
from sbfunc.policies.base import Policy, SelectArgs, check_ids, make_policy, stateless
from sbfunc.select import Selection, kept_count
from sbfunc.select.base import check_keep
from sbfunc.select.samplers import random_indices, rank_power_indices, top_k_indices
from sbfunc.validation import check_tensor

__all__ = ["RhoState", "random_subset", "rank_power", "rho_loss", "top_k"]


def rank_power(keep: float) -> Policy:
    """Composer's Selective Backprop law: sample ``k = max(1, floor(keep*N))`` rows without
    replacement, rank ``r`` (0 = lowest score) weighted ``((r + 0.5) / N) ** (1/keep - 1)``.

    Same law as Composer's ``np.random.choice(N, k, replace=False, p=w/sum(w))`` but drawn on
    the scores' device with Gumbel-top-k, from an explicit key, ties in the scores broken
    uniformly at random, and the indices returned sorted. Depends on the scores only through
    their ranks, so any strictly increasing transform of the scores gives the same selection.
    Non-finite scores rank below every finite one with weight 0 (:mod:`sbfunc.select.base`):
    they are kept only when fewer than ``k`` scores are finite. Stateless
    (:class:`~sbfunc.policies.EmptyState`); ``weights=None`` (biased towards high loss on
    purpose); ``keep=1`` keeps every row.

    Args:
        keep: fraction kept, in (0, 1].

    Returns:
        A :class:`~sbfunc.policies.Policy`.

    Raises:
        TypeError: for ``keep`` not a number; at ``select``, for scores that are not a tensor
            (integer and bool scores are accepted as floats,
            :func:`~sbfunc.policies.base.as_scores`).
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
        n = scores.shape[0]
        tie_key, draw_key = sbrandom.split(key)
        tie_noise = sbrandom.bits(tie_key, (n,), device=scores.device)
        u = sbrandom.uniform(draw_key, (n,), device=scores.device)
        return Selection(rank_power_indices(scores, keep, tie_noise, u))

    return stateless(rule)


def top_k(keep: float) -> Policy:
    """The ``k = max(1, floor(keep*N))`` highest scores, ties broken at random by the key.

    Non-finite scores rank below every finite one (:mod:`sbfunc.select.base`): they are kept
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
    return stateless(lambda scores, key, ids: _top(scores, keep, key))


def _top(scores: torch.Tensor, keep: float, key: sbrandom.Key) -> Selection:
    tie_noise = sbrandom.bits(key, (scores.shape[0],), device=scores.device)
    return Selection(top_k_indices(scores, kept_count(scores.shape[0], keep), tie_noise))


def random_subset(keep: float) -> Policy:
    """A uniformly random subset of ``k = max(1, floor(keep*N))`` rows, whatever their
    scores: the control for any selection study.

    Rows with a non-finite score are kept only when fewer than ``k`` are finite (the rule of
    :mod:`sbfunc.select.base`); among the finite rows the draw is uniform. The plain mean over
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


def rho_loss(keep: float, irreducible: torch.Tensor) -> Policy:
    """RHO-LOSS: top-k by *reducible* loss, ``scores - irreducible[ids]``.

    ``irreducible[i]`` is the loss of sample id ``i`` under a model trained on holdout data
    (precomputed once). Mislabelled samples have a high irreducible loss too, so unlike
    loss-based selection RHO-LOSS does not chase them. Needs ``ids``. ``weights=None``. The
    table is the policy's state (:class:`RhoState`), not a constant of the policy: a compiled
    step serves any table, which can be swapped in the train state.

    Args:
        keep: fraction kept, in (0, 1].
        irreducible: ``Tensor[M]`` of irreducible losses indexed by sample id (kept on its
            device; the looked-up values move to the scores' device).

    Raises:
        TypeError: for ``keep`` not a number, or ``irreducible`` not a floating tensor.
        ValueError: for ``keep`` outside (0, 1] or ``irreducible`` not 1-D; at ``select``,
            without ``ids``.

    Example:
        >>> from sbfunc.policies import rho_loss
        >>> policy = rho_loss(0.5, irreducible=torch.tensor([0.0, 4.5, 0.0, 0.0]))
        >>> sel, state = policy.select(torch.tensor([1.0, 5.0, 2.0, 0.5]), policy.init(),
        ...                            key=sbfunc.random.key(0), ids=torch.arange(4))
        >>> sel.indices, state.irreducible[1]
        (tensor([0, 2]), tensor(4.5000))

    References:
        Mindermann et al. 2022, "Prioritized Training on Points that are Learnable, Worth
        Learning, and Not Yet Learnt".
    """
    keep = check_keep(keep)
    check_tensor(
        irreducible, "irreducible", dim=1, floating=True, fix="index it by sample id, Tensor[M]"
    )
    table = irreducible.detach().clone()

    def init() -> RhoState:
        return RhoState(table)

    def rule(scores: torch.Tensor, state: RhoState, a: SelectArgs) -> tuple[Selection, RhoState]:
        ids = check_ids(a.ids, scores.shape[0], "rho_loss").to(state.irreducible.device)
        reducible = scores - state.irreducible.index_select(0, ids).to(scores)
        return _top(reducible, keep, a.key), state

    return make_policy(init, rule)


class RhoState(NamedTuple):
    """The state of :func:`rho_loss`.

    Attributes:
        irreducible: ``Tensor[M]``, the irreducible loss of every sample id.

    Example:
        >>> from sbfunc.policies import rho_loss
        >>> rho_loss(0.5, torch.zeros(3)).init().irreducible
        tensor([0., 0., 0.])

    References:
        Mindermann et al. 2022 (the irreducible loss model).
    """

    irreducible: torch.Tensor
