"""The bytes a data-parallel step moves, predicted from shapes and dtypes.

The predictions use the same bucketing and the same per-collective formulas as the
:class:`~sbfunc.distributed.TrafficMeter` that :class:`~sbfunc.distributed.Comm` feeds, so a
measured step and its prediction agree exactly; see :class:`~sbfunc.distributed.Traffic` for
what ``payload`` and ``received`` count.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from sbfunc.distributed._balance import exchange_plan
from sbfunc.distributed._comm import DEFAULT_BUCKET_BYTES, buckets, nbytes
from sbfunc.distributed._meter import Traffic
from sbfunc.validation import check_int

__all__ = ["gather_traffic", "gradient_traffic", "rebalance_traffic"]


def _check_world(world: int) -> int:
    return check_int(world, "world", low=1)


def gradient_traffic(
    params: Iterable[torch.Tensor], *, world: int, bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> Traffic:
    """One step's gradient all-reduce on one rank: a gradient per parameter plus the two
    ``float32`` statistics (loss sum and row count), in buckets.

    Args:
        params: the parameters (their shapes and dtypes; e.g. ``state.params.values()``).
        world: the number of ranks.
        bucket_bytes: the bucket size of the step.

    Example:
        >>> from sbfunc.distributed import gradient_traffic
        >>> gradient_traffic([torch.zeros(100)], world=2)  # 400 + 8 bytes, half received twice
        Traffic(calls=1, payload=408, received=408)

    References:
        Patarasuk and Yuan 2009 (ring all-reduce: ``2 (W - 1) / W`` of the buffer received).
    """
    world = _check_world(world)
    like = [torch.empty(p.shape, dtype=p.dtype, device="meta") for p in params]
    like.append(torch.empty(2, dtype=torch.float32, device="meta"))
    if world == 1:
        return Traffic()
    sizes = [sum(nbytes(like[i]) for i in b) for b in buckets(like, bucket_bytes)]
    return Traffic(len(sizes), sum(sizes), sum(2 * (world - 1) * s // world for s in sizes))


def gather_traffic(rows: int, row_bytes: int, *, world: int) -> Traffic:
    """One all-gather of ``rows`` rows of ``row_bytes`` bytes from every rank.

    The selection scopes gather the row counts (``gather_traffic(1, 8, world=W)``) and then
    the scores and ids (``gather_traffic(n, 4 + 8, world=W)`` for float32 scores and int64
    ids of ``n`` rows per rank, the longest shard's ``n`` when they differ). A policy that
    reads signals (``Policy.needs``) widens those rows by what it needs: ``4 C`` bytes of
    float32 logits, ``4 D`` of float32 features and ``8`` of an int64 target per row
    (:mod:`sbfunc.distributed`), e.g. ``gather_traffic(n, 12 + 4 * (C + D) + 8,
    world=W)`` for all three.

    Example:
        >>> from sbfunc.distributed import gather_traffic
        >>> gather_traffic(64, 12, world=4)
        Traffic(calls=1, payload=768, received=2304)

    References:
        Thakur, Rabenseifner and Gropp 2005 (all-gather: ``(W - 1)`` blocks received).
    """
    world = _check_world(world)
    if world == 1:
        return Traffic()
    return Traffic(1, rows * row_bytes, (world - 1) * rows * row_bytes)


def rebalance_traffic(kept: Sequence[int], row_bytes: int, *, rank: int) -> Traffic:
    """The rebalancing all-to-all on rank ``rank`` when the ranks kept ``kept`` rows of
    ``row_bytes`` bytes each (a batch row, plus 4 for a float32 weight).

    Example:
        >>> from sbfunc.distributed import rebalance_traffic
        >>> rebalance_traffic([5, 1], 100, rank=1)  # rank 1 receives 2 of rank 0's rows
        Traffic(calls=1, payload=100, received=200)

    References:
        MPI ``MPI_Alltoallv``.
    """
    if len(kept) == 1:
        return Traffic()
    plan = exchange_plan(kept, rank)
    received = sum(plan.receive) - plan.receive[rank]
    return Traffic(1, kept[rank] * row_bytes, received * row_bytes)
