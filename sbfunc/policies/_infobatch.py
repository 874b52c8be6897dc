"""InfoBatch: unbiased random pruning of well-learned samples, with loss rescaling."""

from __future__ import annotations

import torch

from sbfunc.policies._base import Policy, SelectArgs, bernoulli_selection, check_ids, make_policy
from sbfunc.policies._tables import (
    LossTable,
    table_init,
    table_lookup,
    table_needs,
    table_record,
)
from sbfunc.select import Selection
from sbfunc.types import Device
from sbfunc.validation import check_fraction, check_int

__all__ = ["infobatch"]


def infobatch(
    prune_ratio: float = 0.5, delta: float = 0.875, *, num_ids: int, device: Device = None
) -> Policy:
    """InfoBatch: drop each well-learned row with probability ``prune_ratio`` and rescale the
    kept well-learned rows, until a fraction ``delta`` of training has elapsed.

    A row is *well-learned* when its id has a recorded loss (from an earlier ``select``)
    below the mean recorded loss of all seen ids. Well-learned rows are kept with probability
    ``1 - r``, the others always (at least one row is kept). The weights are the
    Horvitz-Thompson weights ``k / (N pi_i)``: ``k/N`` for the others and ``k / (N (1 - r))``
    for the kept well-learned rows, InfoBatch's ``1/(1-r)`` rescaling normalised for the mean
    over the ``k`` kept rows, so that mean is an unbiased estimate of the full-batch mean loss.
    Once ``elapsed >= delta`` every row is kept with unit weights (the annealing phase).
    The decision uses only the recorded losses, so only ids never recorded need a score
    (``score_rows``); fresh scores are recorded after the decision, and ``record`` takes the
    training forward's losses of the kept rows (what InfoBatch uses). A row whose fresh score
    is not finite ranks below every finite one (:mod:`sbfunc.select`): it is dropped
    (kept only, with weight ``k/N``, when no row is finite), and it is not recorded. Needs
    ``ids``.

    Args:
        prune_ratio: ``r``, the drop probability of a well-learned row, in [0, 1).
        delta: the fraction of training after which pruning stops, in [0, 1].
        num_ids: the number of sample ids (the dataset size).
        device: where the state lives (the scores' device).

    Raises:
        ValueError, TypeError: for arguments outside those ranges; at ``select``,
            ``ValueError`` without ``ids``.

    Example:
        >>> from sbfunc.policies import infobatch
        >>> policy = infobatch(prune_ratio=0.5, num_ids=4)
        >>> ids, losses = torch.arange(4), torch.tensor([0.1, 0.2, 3.0, 4.0])
        >>> sel, state = policy.select(losses, policy.init(), key=sbfunc.random.key(0), ids=ids)
        >>> sel.indices.shape  # nothing recorded yet: everything kept
        torch.Size([4])
        >>> sel, state = policy.select(losses, state, key=sbfunc.random.key(1), ids=ids, epoch=1)
        >>> bool(torch.isin(torch.tensor([2, 3]), sel.indices).all())
        True

    References:
        Qin et al. 2024, "InfoBatch: Lossless Training Speed Up by Unbiased Dynamic Data
        Pruning".
    """
    prune_ratio = check_fraction(prune_ratio, "prune_ratio", open_high=True)
    delta = check_fraction(delta, "delta")
    check_int(num_ids, "num_ids", low=1)

    def init() -> LossTable:
        return table_init(num_ids, device=device)

    def rule(scores: torch.Tensor, state: LossTable, a: SelectArgs) -> tuple[Selection, LossTable]:
        n = scores.shape[0]
        ids = check_ids(a.ids, n, "infobatch")
        table = table_record(state, ids, scores, a.epoch, mask=a.scored)
        seen = state.epoch >= 0
        mean = torch.where(seen, state.loss, 0).sum() / seen.sum().clamp_min(1)
        mine = table_lookup(state, ids)
        pruning = torch.as_tensor(a.elapsed, device=scores.device) < delta  # else: anneal
        learned = ((mine.epoch >= 0) & (mine.loss < mean)).to(scores.device) & pruning
        bad = ~scores.isfinite()  # non-finite fresh scores rank below every finite one: dropped
        bad = bad if a.scored is None else bad & a.scored
        inclusion = torch.where(learned, 1.0 - prune_ratio, 1.0).to(scores)
        inclusion = torch.where(bad, 0.0, inclusion)
        return bernoulli_selection(inclusion, a.key, weighted=True), table

    def score_rows(
        state: LossTable, ids: torch.Tensor | None, epoch: int | torch.Tensor
    ) -> torch.Tensor:
        return table_needs(state, ids, epoch, None)

    return make_policy(init, rule, score_rows, table_record)
