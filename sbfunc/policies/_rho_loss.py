"""RHO-LOSS: the top-k rows by reducible loss, the loss minus a reference's (:func:`rho_loss`)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from sbfunc.policies._base import Policy, SelectArgs, check_ids, make_policy
from sbfunc.policies._tables import lookup_by_id, loss_table
from sbfunc.policies._top_k import top_k_selection
from sbfunc.select import Selection, check_keep

__all__ = ["RhoState", "rho_loss"]


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


def rho_loss(keep: float, irreducible: torch.Tensor) -> Policy:
    """RHO-LOSS: top-k by *reducible* loss, ``scores - irreducible[ids]``.

    ``irreducible[i]`` is the loss of sample id ``i`` under a model trained on holdout data
    (precomputed once). Mislabelled samples have a high irreducible loss too, so unlike
    loss-based selection RHO-LOSS does not chase them. Needs ``ids`` (with
    :class:`sbfunc.SelectiveBackprop`: ``ids="<batch field>"``), every one in
    ``[0, len(irreducible))``: checked where reading the ids is free (CPU ids, eager code);
    inside a compiled step or for ids on an accelerator they are not read, and an id out of
    range is torch's indexing error. ``weights=None``. The table is the policy's state
    (:class:`RhoState`), not a constant of the policy: a compiled step serves any table, which
    can be swapped in the train state.

    Args:
        keep: fraction kept, in (0, 1].
        irreducible: ``Tensor[M]`` of irreducible losses indexed by sample id, one entry per
            dataset index (kept on its device; the looked-up values move to the scores'
            device).

    Raises:
        TypeError: for ``keep`` not a number, or ``irreducible`` not a floating tensor.
        ValueError: for ``keep`` outside (0, 1] or ``irreducible`` not 1-D or empty; at
            ``select``, without ``ids``, or (CPU ids, eager code) for an id outside
            ``[0, len(irreducible))``.

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
    table = loss_table(irreducible, "irreducible", "index it by sample id, Tensor[M]")

    def init() -> RhoState:
        return RhoState(table)

    def rule(scores: torch.Tensor, state: RhoState, a: SelectArgs) -> tuple[Selection, RhoState]:
        ids = check_ids(a.ids, scores.shape[0], "rho_loss")
        ref = lookup_by_id(state.irreducible, ids, "irreducible", "rho_loss")
        return top_k_selection(scores - ref.to(scores), keep, a.key), state

    return make_policy(init, rule)
