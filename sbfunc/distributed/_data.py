"""Each rank's slice of a keyed global permutation: no overlap, nothing dropped, reshuffled
every epoch.

Epoch ``e`` orders the ``N`` sample ids by ``sbfunc.random.permutation(fold_in(key, e), N)``
and cuts the order into global batches of ``batch_size * world`` ids (the last one shorter when
``N`` is not a multiple). Rank ``r`` takes the ``r``-th of the ``world`` near-equal contiguous
parts of every global batch: ``batch_size`` ids of a full batch, ``m // world`` or one more of
a last batch of ``m`` (possibly none: the data-parallel step handles a rank without rows). So
every rank runs the same number of steps, the ranks' batches of a step concatenated in rank
order are the global batch in permutation order, and a single process with the global batch
size sees exactly those batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, overload

import torch

from sbfunc import random as sbrandom
from sbfunc.distributed._balance import balanced_counts
from sbfunc.distributed._comm import Comm
from sbfunc.validation import check_int

__all__ = ["shard_ids", "sharded_batches"]


def shard_ids(
    n: int, batch_size: int, *, key: sbrandom.Key, epoch: int, rank: int, world: int
) -> list[torch.Tensor]:
    """Rank ``rank``'s sample ids for every step of ``epoch`` (see the module docs).

    Args:
        n: the number of samples, >= 1.
        batch_size: rows per rank and step (the global batch is ``batch_size * world``), >= 1.
        key: the data key (the same on every rank).
        epoch: the epoch, >= 0: each reshuffles.
        rank: this rank, in ``[0, world)``.
        world: the number of ranks, >= 1.

    Returns:
        One ``int64`` tensor of ids per step, ``ceil(n / (batch_size * world))`` of them.

    Raises:
        ValueError: for arguments outside those ranges.

    Example:
        >>> from sbfunc.distributed import shard_ids
        >>> key = sbfunc.random.key(0)
        >>> for rank in range(2):
        ...     steps = shard_ids(10, 2, key=key, epoch=0, rank=rank, world=2)
        ...     print([ids.tolist() for ids in steps])
        [[0, 8], [1, 7], [3]]
        [[2, 4], [9, 5], [6]]

    References:
        PyTorch ``DistributedSampler`` (which pads or drops instead); JAX
        ``jax.random.permutation``.
    """
    for name, value, low in (("n", n, 1), ("batch_size", batch_size, 1), ("epoch", epoch, 0)):
        check_int(value, name, low=low)
    check_int(world, "world", low=1)
    check_int(rank, "rank", low=0, high=world - 1)
    order = sbrandom.permutation(sbrandom.fold_in(key, epoch), n)
    span = batch_size * world
    out = []
    for start in range(0, n, span):
        counts = balanced_counts(min(span, n - start), world)
        lo = start + sum(counts[:rank])
        out.append(order[lo : lo + counts[rank]])
    return out


class _Epoch(Sequence[tuple[torch.Tensor, ...]]):
    """One rank's batches of one epoch, indexed lazily."""

    def __init__(self, tensors: Sequence[torch.Tensor], ids: list[torch.Tensor]) -> None:
        self.tensors, self.ids = tuple(tensors), ids

    def __len__(self) -> int:
        return len(self.ids)

    @overload
    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[tuple[torch.Tensor, ...]]: ...

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        ids = self.ids[i]
        return (*(t[ids.to(t.device)] for t in self.tensors), ids)


def sharded_batches(
    tensors: Sequence[torch.Tensor],
    batch_size: int,
    *,
    key: sbrandom.Key,
    epoch: int,
    comm: Comm | None = None,
) -> Sequence[tuple[torch.Tensor, ...]]:
    """This rank's batches of one epoch, ``(*(t[ids] for t in tensors), ids)`` per step: a
    sequence with ``len`` (so :func:`sbfunc.fit` counts the steps) that indexes lazily.

    Args:
        tensors: the dataset's tensors, sharing their first axis ``N``.
        batch_size: rows per rank and step.
        key: the data key (the same on every rank).
        epoch: the epoch.
        comm: the :class:`Comm` giving the rank and world size; default ``Comm()``.

    Raises:
        ValueError: as :func:`shard_ids`, or for tensors disagreeing on ``N``.

    Example:
        >>> from sbfunc.distributed import sharded_batches
        >>> x, y = torch.arange(10.0).reshape(5, 2), torch.arange(5)
        >>> [b[2].tolist() for b in sharded_batches([x, y], 2, key=sbfunc.random.key(0), epoch=0)]
        [[0, 2], [4, 1], [3]]
    """
    if not tensors or any(t.dim() == 0 or t.shape[0] != tensors[0].shape[0] for t in tensors):
        raise ValueError("tensors must be one or more tensors sharing their first axis")
    comm = Comm() if comm is None else comm
    n = tensors[0].shape[0]
    ids = shard_ids(n, batch_size, key=key, epoch=epoch, rank=comm.rank, world=comm.world)
    return _Epoch(tensors, ids)
