"""Who sends which kept rows to whom so that every rank backpropagates the same count.

The kept rows of all ranks, in rank order, form one global list of ``K`` rows (for a global
selection this is the selection itself, in batch order). Rebalancing cuts that list into ``W``
contiguous chunks of ``K // W`` or ``K // W + 1`` rows, the longer ones first, and rank ``d``
gets chunk ``d``. Each rank's kept rows are one contiguous stretch of the list, so what rank
``s`` sends to rank ``d`` is the overlap of stretch ``s`` with chunk ``d``: one
``all_to_all_single`` moves everything and the rows stay in the global order.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate
from typing import NamedTuple

from sbfunc.validation import check_int

__all__ = ["ExchangePlan", "balanced_counts", "exchange_plan"]


class ExchangePlan(NamedTuple):
    """One rank's part of a rebalancing ``all_to_all_single``.

    Attributes:
        send: rows this rank sends to each rank (its kept rows, in order, cut into these).
        receive: rows it receives from each rank (concatenated in rank order).

    Example:
        >>> from sbfunc.distributed import exchange_plan
        >>> exchange_plan([5, 1], rank=0)
        ExchangePlan(send=[3, 2], receive=[3, 0])

    References:
        MPI ``MPI_Alltoallv`` (send and receive counts per peer).
    """

    send: list[int]
    receive: list[int]


def balanced_counts(total: int, world: int) -> list[int]:
    """``total`` rows over ``world`` ranks: ``total // world`` each, one more for the first
    ``total % world`` ranks.

    Raises:
        ValueError: for ``total < 0`` or ``world < 1``.

    Example:
        >>> from sbfunc.distributed import balanced_counts
        >>> balanced_counts(7, 3)
        [3, 2, 2]
    """
    check_int(world, "world", low=1)
    check_int(total, "total", low=0)
    q, m = divmod(total, world)
    return [q + (d < m) for d in range(world)]


def _overlap(a0: int, a1: int, b0: int, b1: int) -> int:
    return max(0, min(a1, b1) - max(a0, b0))


def exchange_plan(kept: Sequence[int], rank: int) -> ExchangePlan:
    """The counts rank ``rank`` passes to ``all_to_all_single`` when the ranks hold ``kept``
    rows each (see the module docs).

    Args:
        kept: every rank's kept row count, in rank order (each ``>= 0``).
        rank: this rank, in ``[0, len(kept))``.

    Raises:
        ValueError: for an empty ``kept``, a negative count or ``rank`` out of range.

    Example:
        >>> from sbfunc.distributed import exchange_plan
        >>> [exchange_plan([4, 0, 2], rank=r) for r in range(3)]  # doctest: +NORMALIZE_WHITESPACE
        [ExchangePlan(send=[2, 2, 0], receive=[2, 0, 0]),
         ExchangePlan(send=[0, 0, 0], receive=[2, 0, 0]),
         ExchangePlan(send=[0, 0, 2], receive=[0, 0, 2])]

    References:
        MPI ``MPI_Alltoallv``.
    """
    world = len(kept)
    if world < 1 or any(isinstance(k, bool) or not isinstance(k, int) or k < 0 for k in kept):
        raise ValueError(f"kept must be a non-empty list of ints >= 0, got {list(kept)!r}")
    check_int(rank, "rank", low=0, high=world - 1)
    src = [0, *accumulate(kept)]
    dst = [0, *accumulate(balanced_counts(src[-1], world))]
    send = [_overlap(src[rank], src[rank + 1], dst[d], dst[d + 1]) for d in range(world)]
    receive = [_overlap(src[s], src[s + 1], dst[rank], dst[rank + 1]) for s in range(world)]
    return ExchangePlan(send, receive)
