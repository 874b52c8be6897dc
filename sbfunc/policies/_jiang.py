"""Jiang et al.'s Selective Backprop (CDF^beta over a loss history) and Stale-SB."""

from __future__ import annotations

from typing import NamedTuple

import torch

from sbfunc import random as sbrandom
from sbfunc._tracing import replace_by_constructor
from sbfunc.policies._base import Policy, SelectArgs, bernoulli_selection, check_ids, make_policy
from sbfunc.policies._tables import (
    LossHistory,
    LossTable,
    history_cdf,
    history_init,
    history_push,
    table_init,
    table_lookup,
    table_needs,
    table_record,
)
from sbfunc.select import Selection
from sbfunc.types import Device
from sbfunc.validation import check_fraction, check_int, check_real

__all__ = ["StaleState", "jiang_cdf", "stale_sb"]


@replace_by_constructor  # its copies survive a compiled frame on torch 2.11
class StaleState(NamedTuple):
    """The state of :func:`stale_sb`.

    Attributes:
        history: the ring buffer of recent losses.
        table: the cached loss of every id and the epoch it was computed in.
        max_age: a cached loss at least this many epochs old is refreshed.

    Example:
        >>> from sbfunc.policies import stale_sb
        >>> stale_sb(1.0, num_ids=3, history=2, max_age=3).init().max_age
        3

    References:
        Jiang et al. 2019 (Stale-SB).
    """

    history: LossHistory
    table: LossTable
    max_age: int


def _check_beta(beta: float) -> float:
    return check_real(beta, "beta", low=0, open_low=True, fix="beta=1 keeps about half")


def _cdf_select(
    history: LossHistory,
    losses: torch.Tensor,
    key: sbrandom.Key,
    beta: float,
    sampling_min: float,
    reweight: bool,
) -> tuple[Selection, LossHistory]:
    history = history_push(history, losses)  # the batch enters the history first
    keep_prob = history_cdf(history, losses).pow(beta).clamp_min(sampling_min)
    # Non-finite losses rank below every finite one: never kept while a finite row can be (the
    # batch's finite maximum has CDF 1); a batch with none keeps one random row.
    keep_prob = torch.where(losses.isfinite(), keep_prob, 0.0)
    return bernoulli_selection(keep_prob, key, weighted=reweight), history


def jiang_cdf(
    beta: float,
    history: int = 1024,
    sampling_min: float = 0.0,
    *,
    reweight: bool = False,
    device: Device = None,
) -> Policy:
    """Selective Backprop: keep each row independently with probability
    ``max(sampling_min, CDF_R(L)^beta)``.

    ``CDF_R`` is the empirical CDF of the ``R = history`` most recent scores, the batch's own
    scores pushed first (so the batch maximum has CDF 1 and is always kept for
    ``sampling_min=0``). A row with a non-finite score is never kept while the batch has a
    finite one (:mod:`sbfunc.select`). On a stationary loss distribution the expected kept
    fraction is
    ``E[U^beta] = 1/(beta+1)``: 50/33/25% for ``beta = 1/2/3``. The kept count varies per batch
    (at least 1, see :func:`~sbfunc.policies.bernoulli_selection`); feed the rows to a
    :class:`~sbfunc.selective_backprop.Queue` to backpropagate fixed-size batches as in the paper.

    Args:
        beta: the selectivity exponent, > 0.
        history: ``R``, the size of the loss ring buffer, >= 1.
        sampling_min: the least keep probability, in [0, 1].
        reweight: attach Horvitz-Thompson weights ``k / (N p_i)`` (unbiased mean, see
            :mod:`sbfunc.policies`); the paper does not (``weights=None``).
        device: where the state lives (the scores' device).

    Raises:
        ValueError, TypeError: for arguments outside those ranges.

    Example:
        >>> from sbfunc.policies import jiang_cdf
        >>> policy = jiang_cdf(beta=1.0, history=8)
        >>> sel, state = policy.select(torch.tensor([0.1, 2.0, 0.3, 5.0]), policy.init(),
        ...                            key=sbfunc.random.key(0))
        >>> bool((sel.indices == 3).any()), int(state.pushed)
        (True, 4)

    References:
        Jiang et al. 2019, "Accelerating Deep Learning by Focusing on the Biggest Losers".
    """
    beta = _check_beta(beta)
    check_int(history, "history", low=1)
    sampling_min = check_fraction(sampling_min, "sampling_min")

    def init() -> LossHistory:
        return history_init(history, device=device)

    def rule(
        scores: torch.Tensor, state: LossHistory, a: SelectArgs
    ) -> tuple[Selection, LossHistory]:
        return _cdf_select(state, scores, a.key, beta, sampling_min, reweight)

    return make_policy(init, rule)


def needs_scoring(
    state: StaleState, ids: torch.Tensor | None, epoch: int | torch.Tensor
) -> torch.Tensor:
    """Which rows need a fresh scoring forward under :func:`stale_sb`: ids never scored, or
    whose cached loss is at least ``max_age`` epochs old.

    The caller may skip the scoring forward for the other rows and pass ``scored=`` to
    ``select``: it uses their cached loss instead.

    Args:
        state: a :class:`StaleState`.
        ids: ``int64 Tensor[N]`` sample ids.
        epoch: the current epoch.

    Returns:
        ``bool Tensor[N]`` on the state's device.

    Example:
        >>> from sbfunc.policies import stale_sb
        >>> policy = stale_sb(1.0, num_ids=4, max_age=2)
        >>> state = policy.init()
        >>> state = policy.record(state, torch.tensor([0, 1]), torch.tensor([1.0, 2.0]), 0)
        >>> needs_scoring(state, torch.tensor([0, 1, 2]), epoch=1)
        tensor([False, False,  True])
        >>> needs_scoring(state, torch.tensor([0, 1, 2]), epoch=2)
        tensor([True, True, True])

    References:
        Jiang et al. 2019 (Stale-SB).
    """
    return table_needs(state.table, ids, epoch, state.max_age)


def stale_sb(
    beta: float,
    *,
    num_ids: int,
    max_age: int = 2,
    history: int = 1024,
    sampling_min: float = 0.0,
    reweight: bool = False,
    device: Device = None,
) -> Policy:
    """Stale-SB: :func:`jiang_cdf` on cached per-id losses, refreshed every ``max_age`` epochs.

    At ``select``, the rows marked fresh by ``scored`` (all rows when it is ``None``) take
    their loss from ``scores`` and are cached with the current epoch; the other rows use their
    cached loss. :func:`needs_scoring` (the policy's ``score_rows``) says which rows must be
    fresh: ids never seen or cached at least ``max_age`` epochs ago, so the others' scoring
    forward can be skipped; ``record`` caches losses computed elsewhere (the training
    forward). The effective losses of the whole batch then enter the history and are kept
    with probability ``max(sampling_min, CDF_R(L)^beta)``. ``max_age=1`` rescores every row
    every epoch (plain SB); the paper uses 2 or 3. Needs ``ids``.

    Args:
        beta: the selectivity exponent, > 0.
        num_ids: the number of sample ids (the dataset size); ids lie in ``[0, num_ids)``.
        max_age: the age in epochs at which a cached loss is refreshed, >= 1.
        history: ``R``, the size of the loss ring buffer, >= 1.
        sampling_min: the least keep probability, in [0, 1].
        reweight: attach Horvitz-Thompson weights (see :func:`jiang_cdf`).
        device: where the state lives (the scores' device).

    Raises:
        ValueError, TypeError: for arguments outside those ranges; at ``select``,
            ``ValueError`` without ``ids``.

    Example:
        >>> from sbfunc.policies import stale_sb
        >>> policy = stale_sb(2.0, num_ids=10)
        >>> sel, state = policy.select(torch.tensor([0.5, 3.0, 1.0]), policy.init(),
        ...                            key=sbfunc.random.key(0), ids=torch.tensor([7, 2, 5]))
        >>> state.table.epoch[[7, 2, 5]]
        tensor([0, 0, 0])

    References:
        Jiang et al. 2019, "Accelerating Deep Learning by Focusing on the Biggest Losers"
        (Stale-SB).
    """
    beta = _check_beta(beta)
    check_int(num_ids, "num_ids", low=1)
    check_int(max_age, "max_age", low=1)
    check_int(history, "history", low=1)
    sampling_min = check_fraction(sampling_min, "sampling_min")

    def init() -> StaleState:
        return StaleState(
            history_init(history, device=device), table_init(num_ids, device=device), max_age
        )

    def rule(
        scores: torch.Tensor, state: StaleState, a: SelectArgs
    ) -> tuple[Selection, StaleState]:
        ids = check_ids(a.ids, scores.shape[0], "stale_sb")
        fresh = torch.ones_like(scores, dtype=torch.bool) if a.scored is None else a.scored
        cached = table_lookup(state.table, ids).loss.to(scores)
        losses = torch.where(fresh, scores, cached)
        table = table_record(state.table, ids, scores, a.epoch, mask=fresh)
        selection, hist = _cdf_select(state.history, losses, a.key, beta, sampling_min, reweight)
        return selection, StaleState(hist, table, state.max_age)

    def record(
        state: StaleState, ids: torch.Tensor, losses: torch.Tensor, epoch: int | torch.Tensor
    ) -> StaleState:
        return state._replace(table=table_record(state.table, ids, losses, epoch))

    return make_policy(init, rule, needs_scoring, record)
