"""Checkpoints of a data-parallel run: the replicated state once, the per-rank parts beside it.

Under :func:`make_data_parallel_step` the train state is the same on every rank (parameters,
optimizer and policy states, the clock, the skip counter) except two *rank-local* parts:
``state.time``'s sample counters (each rank counts its own rows) and the refill queues of
Selective Backprop (each rank queues its own kept rows). :func:`save_data_parallel` gathers
the small local parts to rank 0, which writes one :mod:`sbfunc.checkpoint` file holding rank
0's state once and every rank's local part; :func:`load_data_parallel` gives every rank the
shared state with its own local part back, so a run resumes bit for bit on the same world
size.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import optree
import torch
import torch.distributed as dist

from sbfunc import checkpoint as sbcheckpoint
from sbfunc.distributed._comm import Comm
from sbfunc.engine import TrainState
from sbfunc.selective_backprop import Queue, empty_queue

__all__ = [
    "RankLocal",
    "join_state",
    "load_data_parallel",
    "replica_mismatches",
    "save_data_parallel",
    "split_state",
]


class RankLocal(NamedTuple):
    """The rank-local part of a train state.

    Attributes:
        samples_forwarded: ``state.time.samples_forwarded`` of this rank.
        samples_backpropagated: ``state.time.samples_backpropagated`` of this rank.
        queues: every refill :class:`~sbfunc.selective_backprop.Queue` in
            ``state.algorithm_state``, in flattening order.

    Example:
        >>> from sbfunc.distributed import RankLocal
        >>> RankLocal(10, 5, ()).samples_backpropagated
        5

    References:
        PyTorch Distributed Checkpoint (replicated versus per-rank state).
    """

    samples_forwarded: int
    samples_backpropagated: int
    queues: tuple[Queue, ...]


def _is_queue(x: Any) -> bool:
    return isinstance(x, Queue)


def split_state(state: TrainState) -> tuple[TrainState, RankLocal]:
    """``(shared, local)``: the state with its rank-local parts blanked (zero counters, empty
    queues), the same on every rank, and those parts.

    Example:
        >>> from sbfunc.distributed import join_state, split_state
        >>> state = sbfunc.TrainState({}, {}, sbfunc.random.key(0),
        ...                           time=sbfunc.Time(step=3, samples_forwarded=12))
        >>> shared, local = split_state(state)
        >>> shared.time.samples_forwarded, local.samples_forwarded
        (0, 12)
        >>> join_state(shared, local) == state
        True

    References:
        PyTorch Distributed Checkpoint (replicated versus per-rank state).
    """
    tree: Any = state.algorithm_state
    leaves, spec = optree.tree_flatten(tree, is_leaf=_is_queue, none_is_leaf=True)
    queues = tuple(x for x in leaves if _is_queue(x))
    blank = [empty_queue(x.rows) if _is_queue(x) else x for x in leaves]
    t = state.time
    shared = state.replace(
        algorithm_state=optree.tree_unflatten(spec, blank),
        time=t._replace(samples_forwarded=0, samples_backpropagated=0),
    )
    return shared, RankLocal(t.samples_forwarded, t.samples_backpropagated, queues)


def join_state(shared: TrainState, local: RankLocal) -> TrainState:
    """Undo :func:`split_state`: ``shared`` with ``local``'s counters and queues.

    Raises:
        ValueError: if ``local`` holds another number of queues than ``shared``.
    """
    tree: Any = shared.algorithm_state
    leaves, spec = optree.tree_flatten(tree, is_leaf=_is_queue, none_is_leaf=True)
    slots = [i for i, x in enumerate(leaves) if _is_queue(x)]
    if len(slots) != len(local.queues):
        raise ValueError(
            f"local has {len(local.queues)} queues for a state with {len(slots)} refill queues"
        )
    for i, q in zip(slots, local.queues, strict=True):
        leaves[i] = q
    time = shared.time._replace(
        samples_forwarded=local.samples_forwarded,
        samples_backpropagated=local.samples_backpropagated,
    )
    return shared.replace(algorithm_state=optree.tree_unflatten(spec, leaves), time=time)


def _cpu(tree: Any) -> Any:
    return optree.tree_map(
        lambda x: x.detach().cpu() if isinstance(x, torch.Tensor) else x, tree, none_is_leaf=True
    )


def save_data_parallel(
    state: TrainState, path: str | os.PathLike[str], *, comm: Comm | None = None
) -> None:
    """Write a data-parallel train state once (from rank 0); every rank must call it.

    Rank 0 writes ``path`` atomically (:func:`sbfunc.checkpoint.save`): its state, and the
    :class:`RankLocal` part of every rank (gathered as Python objects, small: counters and
    queued rows). Every rank returns once the file is complete.

    Args:
        state: this rank's state.
        path: the file (on a file system every rank can read, for :func:`load_data_parallel`).
        comm: the :class:`Comm`; default ``Comm()``.

    Example:
        >>> import tempfile, pathlib
        >>> from sbfunc.distributed import load_data_parallel, save_data_parallel
        >>> state = sbfunc.TrainState({"w": torch.ones(2)}, {}, sbfunc.random.key(0))
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "run.pt"
        >>> save_data_parallel(state, path)  # one process here: rank 0 of a world of one
        >>> load_data_parallel(path, like=state.replace(params={"w": torch.zeros(2)})).params
        {'w': tensor([1., 1.])}

    References:
        PyTorch ``torch.distributed.gather_object``; PyTorch Distributed Checkpoint (rank 0
        writes replicated state once).
    """
    comm = Comm() if comm is None else comm
    local = _cpu(split_state(state)[1])
    if comm.world == 1:
        parts: list[Any] = [local]
    else:
        parts = [None] * comm.world if comm.rank == 0 else []
        dist.gather_object(local, parts if comm.rank == 0 else None, group=comm.group, group_dst=0)
    if comm.rank == 0:
        sbcheckpoint.save({"state": _cpu(state), "ranks": parts}, path)
    if comm.world > 1:
        dist.barrier(group=comm.group)


def load_data_parallel(
    path: str | os.PathLike[str], like: TrainState, *, comm: Comm | None = None
) -> TrainState:
    """Read a file written by :func:`save_data_parallel` on every rank: the shared state with
    this rank's local part, each tensor on the device of ``like``'s matching tensor.

    Args:
        path: the file.
        like: a fresh state of the same run (``step.init(...)``), the template.
        comm: the :class:`Comm`; default ``Comm()``.

    Raises:
        sbfunc.checkpoint.CheckpointError: for a damaged file or another structure.
        ValueError: if the file was written by another world size.
    """
    comm = Comm() if comm is None else comm
    local_like = split_state(like)[1]
    template = {"state": like, "ranks": [local_like] * comm.world}
    try:
        loaded: Any = sbcheckpoint.load(path, like=template, map_location="cpu")
    except sbcheckpoint.CheckpointError as err:
        if "['ranks']" in str(err):
            raise ValueError(
                f"{os.fspath(path)!r} does not hold {comm.world} ranks' parts: it was saved by "
                "another world size (resume on the world size that saved it)"
            ) from err
        raise
    state: Any = join_state(split_state(loaded["state"])[0], loaded["ranks"][comm.rank])
    template_tree: Any = like
    moved: Any = optree.tree_map(
        lambda x, ref: x.to(ref.device) if isinstance(x, torch.Tensor) else x,
        state,
        template_tree,
        none_is_leaf=True,
    )
    return moved


def replica_mismatches(tree: Any, *, comm: Comm | None = None) -> list[str]:
    """The paths of the tensor leaves of ``tree`` that differ from rank 0's (bit for bit);
    every rank must call it with trees of the same structure. A debugging aid: it moves the
    whole tree.

    Example:
        >>> from sbfunc.distributed import replica_mismatches
        >>> replica_mismatches({"w": torch.ones(2)})  # one process: nothing to differ from
        []
    """
    comm = Comm() if comm is None else comm
    paths, leaves, _ = optree.tree_flatten_with_path(tree, none_is_leaf=True)
    tensors = [(p, x) for p, x in zip(paths, leaves, strict=True) if isinstance(x, torch.Tensor)]
    if comm.world == 1 or not tensors:
        return []
    theirs = comm.broadcast([x for _, x in tensors], purpose="checks")
    return [
        "".join(f"[{k!r}]" for k in p)
        for (p, x), y in zip(tensors, theirs, strict=True)
        if not (x.dtype == y.dtype and torch.equal(x, y))
    ]
