"""The refill queue: selected rows wait until a full backprop batch of size ``b`` is ready.

Variable-count policies (:func:`~sbfunc.policies.jiang_cdf`) keep a different number of rows
every batch; Jiang et al. backpropagate fixed batches by queueing the selected rows. The queue
is a pure value over any pytree batch: rows leave in the order they arrived, never dropped or
duplicated, and :func:`flush` empties it at the end of an epoch.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.utils._pytree as torch_pytree

from sbfunc.batch import batch_size, take
from sbfunc.policies.base import check_positive_int

__all__ = ["Queue", "dequeue", "empty_queue", "enqueue", "flush"]


class Queue(NamedTuple):
    """A FIFO of batch rows.

    Attributes:
        rows: a pytree batch holding the queued rows (possibly zero of them).

    Example:
        >>> from sbfunc.policies import Queue, empty_queue
        >>> isinstance(empty_queue((torch.zeros(2),)), Queue)
        True

    References:
        Jiang et al. 2019 (the selected-samples queue).
    """

    rows: Any


def empty_queue(like: Any) -> Queue:
    """An empty queue for batches with the structure, dtypes and devices of ``like``.

    Args:
        like: a pytree batch (e.g. the first batch of the epoch); its rows are not queued.

    Raises:
        ValueError: if ``like`` is not a batch (see :func:`sbfunc.batch_size`).

    Example:
        >>> from sbfunc.policies import empty_queue
        >>> empty_queue({"x": torch.zeros(3, 2), "y": torch.zeros(3)}).rows["x"].shape
        torch.Size([0, 2])

    References:
        Jiang et al. 2019 (the selected-samples queue).
    """
    batch_size(like)
    return Queue(take(like, torch.zeros(0, dtype=torch.int64)))


def enqueue(queue: Queue, rows: Any) -> Queue:
    """Append ``rows`` (a batch of the queue's structure) at the back; returns a new queue.

    Metadata leaves (non-tensors, 0-d tensors) keep the queue's values.

    Raises:
        ValueError: if ``rows`` has another pytree structure, or its leaves disagree on the
            sample dimension.

    Example:
        >>> from sbfunc.policies import empty_queue, enqueue
        >>> batch = (torch.arange(3), torch.zeros(3))
        >>> enqueue(enqueue(empty_queue(batch), batch), batch).rows[0]
        tensor([0, 1, 2, 0, 1, 2])

    References:
        Jiang et al. 2019 (the selected-samples queue).
    """
    batch_size(rows)

    def cat(old: Any, new: Any) -> Any:
        if isinstance(old, torch.Tensor) and old.dim() >= 1:
            return torch.cat([old, new.to(old.device)])
        return old

    return Queue(torch_pytree.tree_map(cat, queue.rows, rows))


def dequeue(queue: Queue, b: int) -> tuple[Any | None, Queue]:
    """Take the ``b`` oldest rows as a batch when at least ``b`` are queued.

    Args:
        queue: a :class:`Queue`.
        b: the backprop batch size, >= 1.

    Returns:
        ``(batch, rest)`` with a batch of exactly ``b`` rows, or ``(None, queue)`` when fewer
        are queued.

    Raises:
        ValueError, TypeError: for ``b`` not an int >= 1.

    Example:
        >>> from sbfunc.policies import dequeue, empty_queue, enqueue
        >>> batch = (torch.arange(3),)
        >>> q = enqueue(empty_queue(batch), batch)
        >>> out, q = dequeue(q, 2)
        >>> out, dequeue(q, 2)[0]
        ((tensor([0, 1]),), None)

    References:
        Jiang et al. 2019 (the selected-samples queue).
    """
    check_positive_int(b, "b")
    size = batch_size(queue.rows)
    if size < b:
        return None, queue
    head = take(queue.rows, torch.arange(b))
    return head, Queue(take(queue.rows, torch.arange(b, size)))


def flush(queue: Queue) -> tuple[Any | None, Queue]:
    """Take every queued row (the leftover at the end of an epoch) and empty the queue.

    Returns:
        ``(batch, empty)``, or ``(None, queue)`` when nothing is queued.

    Example:
        >>> from sbfunc.policies import empty_queue, enqueue, flush
        >>> batch = (torch.arange(3),)
        >>> out, q = flush(enqueue(empty_queue(batch), batch))
        >>> out, q.rows
        ((tensor([0, 1, 2]),), (tensor([], dtype=torch.int64),))

    References:
        Jiang et al. 2019 (the selected-samples queue).
    """
    size = batch_size(queue.rows)
    if size == 0:
        return None, queue
    return queue.rows, Queue(take(queue.rows, torch.arange(0)))
