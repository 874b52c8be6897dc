"""The refill queue: selected rows wait until a full backprop batch of size ``b`` is ready.

Variable-count policies (:func:`~sbfunc.policies.jiang_cdf`) keep a different number of rows
every batch; Jiang et al. backpropagate fixed batches by queueing the selected rows. The queue
is a pure value over any pytree batch: rows leave in the order they arrived, never dropped or
duplicated, and :func:`flush` empties it at the end of an epoch. Every per-sample leaf is
queued (tensors, NumPy arrays, lists and tuples of strings or ids; see :mod:`sbfunc.batch`),
so the fields of a row stay together; a ``per_sample`` spec (:data:`sbfunc.types.PerSample`)
says which leaves those are when the default rule guesses wrong, and must be the same on
every call for one queue.
"""

from __future__ import annotations

import sys
from typing import Any, NamedTuple

import torch

from sbfunc._rows import ndarray_type, path_str, rebuild_sequence, walk
from sbfunc.batch import batch_size, take
from sbfunc.types import PerSample
from sbfunc.validation import check_int

__all__ = ["Queue", "dequeue", "empty_queue", "enqueue", "flush", "refill"]


class Queue(NamedTuple):
    """A FIFO of batch rows.

    Attributes:
        rows: a pytree batch holding the queued rows (possibly zero of them).

    Example:
        >>> from sbfunc.selective_backprop import Queue, empty_queue
        >>> isinstance(empty_queue((torch.zeros(2),)), Queue)
        True

    References:
        Jiang et al. 2019 (the selected-samples queue).
    """

    rows: Any


def empty_queue(like: Any, *, per_sample: PerSample = None) -> Queue:
    """An empty queue for batches with the structure, dtypes and devices of ``like``.

    Args:
        like: a pytree batch (e.g. the first batch of the epoch); its rows are not queued, its
            metadata leaves (see :mod:`sbfunc.batch`) are the queue's until :func:`enqueue`.
        per_sample: which leaves are per-sample (:data:`sbfunc.types.PerSample`); ``None``
            infers them.

    Raises:
        ValueError: if ``like`` is not a batch (see :func:`sbfunc.batch.batch_size`).
        TypeError: for a malformed ``per_sample`` spec.

    Example:
        >>> from sbfunc.selective_backprop import empty_queue
        >>> empty_queue({"x": torch.zeros(3, 2), "name": ["a", "b", "c"]}).rows
        {'x': tensor([], size=(0, 2)), 'name': []}
    """
    batch_size(like, per_sample=per_sample)
    return Queue(take(like, torch.zeros(0, dtype=torch.int64), per_sample=per_sample))


_Leaf = tuple[tuple[Any, ...], Any, "int | None"]
"""``(path, leaf, size)``: a leaf of a batch and its rows (``None``: metadata)."""


def _leaves(batch: Any, per_sample: PerSample) -> list[_Leaf]:
    """``(path, leaf, rows)`` of every leaf of ``batch`` outside ``False`` subtrees."""
    found: list[_Leaf] = []

    def visit(path: tuple[Any, ...], leaf: Any, size: int | None) -> Any:
        found.append((path, leaf, size))
        return leaf

    walk(batch, per_sample, visit, rebuild=False)
    return found


def _concat(path: tuple[Any, ...], old: Any, new: Any) -> Any:
    """``old`` followed by the rows of ``new`` (the same kind of per-sample leaf)."""
    nd = ndarray_type()
    if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor):
        return torch.cat([old, new.to(old.device)])
    if nd is not None and isinstance(old, nd) and isinstance(new, nd):
        return sys.modules["numpy"].concatenate([old, new])
    sequence = (list, tuple)
    if isinstance(old, sequence) and isinstance(new, sequence):
        return rebuild_sequence(old, [*old, *new])
    raise TypeError(
        f"rows {path_str(path)} is a {type(new).__name__}, but the queue holds a "
        f"{type(old).__name__} there; queue batches of one structure"
    )


def enqueue(queue: Queue, rows: Any, *, per_sample: PerSample = None) -> Queue:
    """Append ``rows`` (a batch of the queue's structure) at the back; returns a new queue.

    Every per-sample leaf is concatenated: tensors on the queue's device, NumPy arrays, and
    lists/tuples of per-sample values (strings, ids) alike, so a row's fields stay aligned.
    Metadata leaves (and subtrees the spec marks ``False``) take the values of ``rows``, the
    newest batch.

    Args:
        queue: a :class:`Queue`.
        rows: a batch with the structure of ``queue.rows``.
        per_sample: the spec the queue was made with (:data:`sbfunc.types.PerSample`).

    Raises:
        ValueError: if ``rows`` has another structure or other per-sample leaves than the
            queue, or its leaves disagree on the sample dimension.
        TypeError: if a leaf of ``rows`` is of another kind than the queue's there, or for a
            malformed ``per_sample`` spec.

    Example:
        >>> from sbfunc.selective_backprop import empty_queue, enqueue
        >>> batch = (torch.arange(3), ("a", "b", "c"))
        >>> enqueue(enqueue(empty_queue(batch), batch), batch).rows
        (tensor([0, 1, 2, 0, 1, 2]), ('a', 'b', 'c', 'a', 'b', 'c'))
    """
    batch_size(rows, per_sample=per_sample)
    return _enqueued(queue, rows, per_sample)[0]


def _enqueued(queue: Queue, rows: Any, per_sample: PerSample) -> tuple[Queue, int]:
    """:func:`enqueue`, and the number of rows queued after it (read from the leaves)."""
    old = _leaves(queue.rows, per_sample)
    new = _leaves(rows, per_sample)
    if [(p, n is None) for p, _, n in old] != [(p, n is None) for p, _, n in new]:
        raise ValueError(
            "rows must have the queue's structure, per-sample leaves "
            f"{_paths(old)}; got per-sample leaves {_paths(new)} ({len(new)} leaves, the "
            f"queue has {len(old)})"
        )
    queued = iter([leaf for _, leaf, n in old if n is not None])

    def cat(path: tuple[Any, ...], leaf: Any, size: int | None) -> Any:
        return leaf if size is None else _concat(path, next(queued), leaf)

    return Queue(walk(rows, per_sample, cat, rebuild=True)), _count(old) + _count(new)


def _count(leaves: list[_Leaf]) -> int:
    return next((n for _, _, n in leaves if n is not None), 0)


def _paths(leaves: list[_Leaf]) -> str:
    return ", ".join(path_str(p) for p, _, n in leaves if n is not None) or "none"


def dequeue(queue: Queue, b: int, *, per_sample: PerSample = None) -> tuple[Any | None, Queue]:
    """Take the ``b`` oldest rows as a batch when at least ``b`` are queued.

    Args:
        queue: a :class:`Queue`.
        b: the backprop batch size, >= 1.
        per_sample: the spec the queue was made with (:data:`sbfunc.types.PerSample`).

    Returns:
        ``(batch, rest)`` with a batch of exactly ``b`` rows, or ``(None, queue)`` when fewer
        are queued.

    Raises:
        ValueError, TypeError: for ``b`` not an int >= 1.

    Example:
        >>> from sbfunc.selective_backprop import dequeue, empty_queue, enqueue
        >>> batch = (torch.arange(3),)
        >>> q = enqueue(empty_queue(batch), batch)
        >>> out, q = dequeue(q, 2)
        >>> out, dequeue(q, 2)[0]
        ((tensor([0, 1]),), None)
    """
    check_int(b, "b", low=1)
    size = batch_size(queue.rows, per_sample=per_sample)
    return (None, queue) if size < b else _split(queue, b, size, per_sample)


def _split(queue: Queue, b: int, size: int, per_sample: PerSample) -> tuple[Any, Queue]:
    """The ``b`` oldest of the ``size`` queued rows, and the queue of the others."""
    head = take(queue.rows, torch.arange(b), per_sample=per_sample)
    return head, Queue(take(queue.rows, torch.arange(b, size), per_sample=per_sample))


def refill(queue: Queue, rows: Any, b: int, *, per_sample: PerSample = None) -> tuple[Any, Queue]:
    """Queue ``rows``, then take the ``b`` oldest queued rows as a batch when at least ``b`` are
    queued, else zero rows of the structure of ``rows`` (a step on it makes no update):
    Selective Backprop's refill, :func:`enqueue` then :func:`dequeue` with the queue's size
    carried from one to the other (each batch walked once).

    Args:
        queue: a :class:`Queue`.
        rows: the kept rows, a batch of the queue's structure whose leaves agree on their rows
            (as :func:`sbfunc.batch.take` makes them: they are not counted again).
        b: the backprop batch size, >= 1.
        per_sample: the spec the queue was made with (:data:`sbfunc.types.PerSample`).

    Returns:
        ``(batch, queue)``.

    Example:
        >>> from sbfunc.selective_backprop import empty_queue
        >>> batch = (torch.arange(3),)
        >>> out, q = refill(empty_queue(batch), batch, 4)
        >>> out, refill(q, batch, 4)[0]
        ((tensor([], dtype=torch.int64),), (tensor([0, 1, 2, 0]),))
    """
    queue, size = _enqueued(queue, rows, per_sample)
    if size < b:  # 0 rows: the step makes no update
        return take(rows, torch.zeros(0, dtype=torch.int64), per_sample=per_sample), queue
    return _split(queue, b, size, per_sample)


def flush(queue: Queue, *, per_sample: PerSample = None) -> tuple[Any | None, Queue]:
    """Take every queued row (the leftover at the end of an epoch) and empty the queue.

    Args:
        queue: a :class:`Queue`.
        per_sample: the spec the queue was made with (:data:`sbfunc.types.PerSample`).

    Returns:
        ``(batch, empty)``, or ``(None, queue)`` when nothing is queued.

    Example:
        >>> from sbfunc.selective_backprop import empty_queue, enqueue, flush
        >>> batch = (torch.arange(3),)
        >>> out, q = flush(enqueue(empty_queue(batch), batch))
        >>> out, q.rows
        ((tensor([0, 1, 2]),), (tensor([], dtype=torch.int64),))
    """
    if batch_size(queue.rows, per_sample=per_sample) == 0:
        return None, queue
    return queue.rows, empty_queue(queue.rows, per_sample=per_sample)
