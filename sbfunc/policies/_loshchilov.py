"""Loshchilov & Hutter's online batch selection: rank-exponential over the latest known losses."""

from __future__ import annotations

import math

import torch

from sbfunc import random as sbrandom
from sbfunc.policies._base import Policy, SelectArgs, check_ids, make_policy
from sbfunc.policies._tables import (
    LossTable,
    table_init,
    table_needs,
    table_ranks,
    table_record,
)
from sbfunc.select import Selection, check_keep, gumbel_top_k, kept_count
from sbfunc.types import Device
from sbfunc.validation import check_int, check_real

__all__ = ["loshchilov"]


def loshchilov(
    s_e: float = 100.0,
    keep: float = 0.5,
    *,
    num_ids: int,
    max_age: int | None = None,
    device: Device = None,
) -> Policy:
    """Rank-exponential selection over the latest known loss of every sample id.

    At ``select`` the batch's fresh scores (``scored``) are recorded in a per-id table (as
    are losses given to ``record``, e.g. the training forward's); every id seen so far is
    ranked by its latest loss (rank ``r = 0`` for the highest of the ``M`` seen ids) and row
    ``i`` of the batch gets weight ``s_e ** (-r_i / (M - 1))``, so the top-ranked sample is
    ``s_e`` times likelier than the bottom one. ``max(1, floor(keep*N))`` rows are drawn without
    replacement in proportion to these weights (Gumbel-top-k). ``weights=None`` (biased on
    purpose). Only ids never recorded, or recorded ``max_age`` epochs ago or more, need a
    fresh score (``score_rows``): the paper ranks by the latest *known* loss. A fresh
    non-finite score ranks below every finite one (:mod:`sbfunc.select`): its row gets
    weight 0 (kept only when too few rows are finite) and the score is not recorded. Needs
    ``ids``.

    Args:
        s_e: selection pressure, the top-to-bottom probability ratio, a float >= 1
            (1 is uniform).
        keep: fraction kept, in (0, 1].
        num_ids: the number of sample ids (the dataset size).
        max_age: refresh a recorded loss this many epochs old (``None``: never; the
            training forward's losses keep it fresh).
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
    check_real(s_e, "s_e", low=1, fix="s_e=1 selects uniformly")
    keep = check_keep(keep)
    check_int(num_ids, "num_ids", low=1)
    if max_age is not None:
        check_int(max_age, "max_age", low=1)
    log_s_e = math.log(s_e)

    def init() -> LossTable:
        return table_init(num_ids, device=device)

    def rule(scores: torch.Tensor, state: LossTable, a: SelectArgs) -> tuple[Selection, LossTable]:
        n = scores.shape[0]
        ids = check_ids(a.ids, n, "loshchilov")
        table = table_record(state, ids, scores, a.epoch, mask=a.scored)
        rank, seen = table_ranks(table, ids)
        span = (seen - 1).clamp_min(1).to(scores)
        log_w = (-log_s_e * rank.to(scores) / span).to(scores.device)
        fresh = torch.ones_like(scores, dtype=torch.bool) if a.scored is None else a.scored
        log_w = torch.where(fresh & ~scores.isfinite(), -torch.inf, log_w)
        gumbel = sbrandom.gumbel(a.key, (n,), device=scores.device, dtype=scores.dtype)
        return Selection(gumbel_top_k(log_w, kept_count(n, keep), gumbel)), table

    def score_rows(
        state: LossTable, ids: torch.Tensor | None, epoch: int | torch.Tensor
    ) -> torch.Tensor:
        return table_needs(state, ids, epoch, max_age)

    return make_policy(init, rule, score_rows, table_record)
