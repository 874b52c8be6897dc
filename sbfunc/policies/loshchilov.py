"""Loshchilov & Hutter's online batch selection: rank-exponential over the latest known losses."""

from __future__ import annotations

import math

import torch

from sbfunc import random as sbrandom
from sbfunc.policies.base import Policy, SelectArgs, check_ids, check_positive_int, make_policy
from sbfunc.policies.tables import Device, LossTable, table_init, table_ranks, table_update
from sbfunc.select import Selection, check_keep, gumbel_top_k, kept_count

__all__ = ["loshchilov"]


def loshchilov(
    s_e: float = 100.0, keep: float = 0.5, *, num_ids: int, device: Device = None
) -> Policy:
    """Rank-exponential selection over the latest known loss of every sample id.

    At ``select`` the batch's scores are recorded in a per-id table; every id seen so far is
    ranked by its latest loss (rank ``r = 0`` for the highest of the ``M`` seen ids) and row
    ``i`` of the batch gets weight ``s_e ** (-r_i / (M - 1))``, so the top-ranked sample is
    ``s_e`` times likelier than the bottom one. ``max(1, floor(keep*N))`` rows are drawn without
    replacement in proportion to these weights (Gumbel-top-k). ``weights=None`` (biased on
    purpose). Needs ``ids``.

    Args:
        s_e: selection pressure, the top-to-bottom probability ratio, a float >= 1
            (1 is uniform).
        keep: fraction kept, in (0, 1].
        num_ids: the number of sample ids (the dataset size).
        device: where the state lives (the scores' device).

    Raises:
        ValueError, TypeError: for arguments outside those ranges; at ``select``,
            ``ValueError`` without ``ids``.

    Example:
        >>> from sbfunc.policies import loshchilov
        >>> policy = loshchilov(s_e=1e6, keep=0.5, num_ids=4)
        >>> sel, state = policy.select(torch.tensor([0.1, 9.0, 0.2, 8.0]), policy.init(),
        ...                            key=sbfunc.random.key(1), ids=torch.arange(4))
        >>> sel.indices
        tensor([1, 3])

    References:
        Loshchilov & Hutter 2015, "Online Batch Selection for Faster Training of Neural
        Networks".
    """
    if isinstance(s_e, bool) or not isinstance(s_e, int | float):
        raise TypeError(f"s_e must be a float >= 1, got {s_e!r}")
    if not (math.isfinite(s_e) and s_e >= 1):
        raise ValueError(f"s_e must be a finite float >= 1, got {s_e!r}")
    keep = check_keep(keep)
    check_positive_int(num_ids, "num_ids")
    log_s_e = math.log(s_e)

    def init() -> LossTable:
        return table_init(num_ids, device=device)

    def rule(scores: torch.Tensor, state: LossTable, a: SelectArgs) -> tuple[Selection, LossTable]:
        n = scores.shape[0]
        ids = check_ids(a.ids, n, "loshchilov")
        table = table_update(state, ids, scores, a.epoch)
        rank, seen = table_ranks(table, ids)
        span = (seen - 1).clamp_min(1).to(scores)
        log_w = (-log_s_e * rank.to(scores) / span).to(scores.device)
        gumbel = sbrandom.gumbel(a.key, (n,), device=scores.device, dtype=scores.dtype)
        return Selection(gumbel_top_k(log_w, kept_count(n, keep), gumbel)), table

    return make_policy(init, rule)
