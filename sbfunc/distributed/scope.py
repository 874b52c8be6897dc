"""Which rows one Selective Backprop selection ranges over under data parallelism.

``SelectiveBackprop(..., scope=selection_scope("local" | "global"))`` scores this rank's rows
and hands the choice to the scope:

* ``"local"`` (Composer's): each rank keeps its own fraction of its own rows, drawing from its
  own stream (the algorithm's key folded with the rank). A stateless rule needs no
  communication at all. A policy with state (loss tables, a loss history) must see every
  rank's rows to stay identical on every rank: the ranks all-gather their scores (and ids),
  and every rank replays every rank's selection in rank order, keeping its own. The policy
  then evolves as in one process that saw the ranks' shards one after another.
* ``"global"`` (InfoBatch's): the ranks all-gather their scores (and ids) and every rank runs
  one selection over the global batch with the **same** key, so every rank computes the same
  selection and the same policy state; each keeps the selected rows it holds.

With ``rebalance=True`` the kept rows then move between ranks (one ``all_to_all_single``) so
that every rank backpropagates the same count (to one row). Rank counts are read on the host:
one small device sync per step under NCCL whenever the scope communicates.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import accumulate, pairwise
from typing import Any, Literal, Protocol

import optree
import torch

from sbfunc import random as sbrandom
from sbfunc.batch import take
from sbfunc.distributed.balance import exchange_plan
from sbfunc.distributed.comm import Comm
from sbfunc.distributed.packing import batch_rows, pack_rows, unpack_rows, with_rows
from sbfunc.select import Selection

__all__ = ["ScopedSelect", "SelectionScope", "selection_scope"]

ScopedSelect = Callable[..., tuple[Selection, Any]]
"""``select(scores, policy_state, *, key, ids) -> (Selection, policy_state)``: the selection
rule of a Selective Backprop (its ``select`` or its policy, epoch and elapsed bound)."""

Pruned = tuple[Any, torch.Tensor | None, Any]


class SelectionScope(Protocol):
    """What ``SelectiveBackprop(scope=...)`` calls to choose and prune its rows.

    ``prune(select, batch, scores, ids, policy_state, *, key)`` returns ``(kept_batch,
    weights, policy_state)``: the rows this rank backpropagates, their loss weights (``None``
    for an unweighted mean) and the policy's next state, identical on every rank.

    Example:
        >>> from sbfunc.distributed import SelectionScope, selection_scope
        >>> scope: SelectionScope = selection_scope("global")

    References:
        MosaicML Composer ``SelectiveBackprop`` (local); Qin et al. 2024, InfoBatch (global).
    """

    def prune(
        self,
        select: ScopedSelect,
        batch: Any,
        scores: torch.Tensor,
        ids: torch.Tensor | None,
        policy_state: Any,
        *,
        key: sbrandom.Key,
    ) -> Pruned: ...


def _has_tensors(tree: Any) -> bool:
    return any(isinstance(x, torch.Tensor) for x in optree.tree_leaves(tree))


class _Scope:
    def __init__(self, comm: Comm, rebalance: bool) -> None:
        self.comm, self.rebalance = comm, rebalance

    def __repr__(self) -> str:
        kind = type(self).__name__[:-5].lower()
        return f"selection_scope({kind!r}, rebalance={self.rebalance}, comm={self.comm!r})"

    def _counts(self, n: int, device: torch.device) -> list[int]:
        """Every rank's ``n``, in rank order (a host read)."""
        if self.comm.world == 1:
            return [n]
        mine = torch.tensor([n], dtype=torch.int64, device=device)
        return self.comm.all_gather(mine, purpose="sizes").tolist()

    def _gather(
        self, scores: torch.Tensor, ids: torch.Tensor | None
    ) -> tuple[list[int], list[tuple[torch.Tensor, torch.Tensor | None]]]:
        """Every rank's row count and ``(scores, ids)``, in rank order."""
        sizes = self._counts(scores.shape[0], scores.device)
        cols = [scores] if ids is None else [scores, ids.to(scores.device)]
        packed, layout = pack_rows(cols)
        most = max(sizes)
        if packed.shape[0] < most:  # uneven shards: pad to the longest, drop the padding below
            packed = torch.cat(
                [packed, packed.new_zeros(most - packed.shape[0], layout.row_bytes)]
            )
        gathered = self.comm.all_gather(packed, purpose="scores")
        out = []
        for r, n in enumerate(sizes):
            parts = unpack_rows(gathered[r * most : r * most + n], layout)
            out.append((parts[0], parts[1] if ids is not None else None))
        return sizes, out

    def _finish(
        self, rows: Any, weights: torch.Tensor | None, kept: list[int], policy_state: Any
    ) -> Pruned:
        """Rebalance (when asked) the kept ``rows``; ``kept`` is every rank's kept count."""
        if not self.rebalance or self.comm.world == 1:
            return rows, weights, policy_state
        plan = exchange_plan(kept, self.comm.rank)
        leaves = batch_rows(rows)
        cols = leaves if weights is None else [*leaves, weights.to(leaves[0].device)]
        packed, layout = pack_rows(cols)
        moved = unpack_rows(self.comm.all_to_all(packed, plan.send, plan.receive), layout)
        new_weights = None if weights is None else moved.pop().to(weights.device)
        return with_rows(rows, moved), new_weights, policy_state


class LocalScope(_Scope):
    """Each rank selects from its own rows (see the module docs)."""

    def prune(
        self,
        select: ScopedSelect,
        batch: Any,
        scores: torch.Tensor,
        ids: torch.Tensor | None,
        policy_state: Any,
        *,
        key: sbrandom.Key,
    ) -> Pruned:
        comm = self.comm
        if comm.world == 1 or not _has_tensors(policy_state):
            sel, policy_state = select(
                scores, policy_state, key=sbrandom.fold_in(key, comm.rank), ids=ids
            )
            rows = take(batch, sel.indices)
            kept = self._counts(sel.indices.shape[0], scores.device) if self.rebalance else []
            return self._finish(rows, sel.weights, kept, policy_state)
        _, shards = self._gather(scores, ids)
        kept, mine = [], None
        for r, (s, i) in enumerate(shards):  # every rank replays every shard, in rank order
            sel, policy_state = select(s, policy_state, key=sbrandom.fold_in(key, r), ids=i)
            kept.append(sel.indices.shape[0])
            mine = sel if r == comm.rank else mine
        assert mine is not None
        return self._finish(take(batch, mine.indices), mine.weights, kept, policy_state)


class GlobalScope(_Scope):
    """One selection over the global batch, the same on every rank (see the module docs)."""

    def prune(
        self,
        select: ScopedSelect,
        batch: Any,
        scores: torch.Tensor,
        ids: torch.Tensor | None,
        policy_state: Any,
        *,
        key: sbrandom.Key,
    ) -> Pruned:
        sizes, shards = self._gather(scores, ids)
        g_scores = torch.cat([s for s, _ in shards])
        g_ids = None if ids is None else torch.cat([i for _, i in shards if i is not None])
        sel, policy_state = select(g_scores, policy_state, key=key, ids=g_ids)
        offsets = [0, *accumulate(sizes)]
        # Selection indices are sorted: each rank's kept rows are one stretch of them.
        edges = torch.tensor(offsets, dtype=sel.indices.dtype, device=sel.indices.device)
        bounds: list[int] = torch.searchsorted(sel.indices, edges).tolist()
        lo, hi = bounds[self.comm.rank], bounds[self.comm.rank + 1]
        local = sel.indices[lo:hi] - offsets[self.comm.rank]
        weights = None if sel.weights is None else sel.weights[lo:hi]
        kept = [b - a for a, b in pairwise(bounds)]
        return self._finish(take(batch, local), weights, kept, policy_state)


def selection_scope(
    kind: Literal["local", "global"] = "global",
    *,
    rebalance: bool = False,
    comm: Comm | None = None,
) -> SelectionScope:
    """The selection scope for ``SelectiveBackprop(scope=...)`` (see the module docs).

    Args:
        kind: ``"local"`` (each rank keeps its fraction of its rows) or ``"global"`` (one
            selection over all ranks' rows).
        rebalance: move kept rows between ranks so every rank backpropagates the same count
            (to one row).
        comm: the :class:`Comm` (process group and traffic meter); default ``Comm()``.

    Returns:
        A :class:`SelectionScope`.

    Raises:
        ValueError: for another ``kind``.
        TypeError: for a ``rebalance`` that is not a bool or a ``comm`` that is not a ``Comm``.

    Example:
        >>> from sbfunc.distributed import selection_scope
        >>> model = torch.nn.Linear(4, 3)
        >>> loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy)
        >>> sb = sbfunc.SelectiveBackprop(0.0, 1.0, keep=0.5, interrupt=0, loss_fn=loss_fn,
        ...                               scope=selection_scope("global"))
        >>> batch = (torch.randn(8, 4), torch.randint(0, 3, (8,)))
        >>> state = sbfunc.State(sbfunc.random.key(0), *sbfunc.split_module(model), batch=batch)
        >>> sb.apply(sbfunc.Event.AFTER_DATALOADER, state).batch[0].shape  # one process here
        torch.Size([4, 4])

    References:
        MosaicML Composer ``SelectiveBackprop`` (local selection); Qin et al. 2024,
        "InfoBatch: Lossless Training Speed Up by Unbiased Dynamic Data Pruning" (global
        selection from all-gathered losses).
    """
    if kind not in ("local", "global"):
        raise ValueError(f"kind must be 'local' or 'global', got {kind!r}")
    if not isinstance(rebalance, bool):
        raise TypeError(f"rebalance must be True or False, got {rebalance!r}")
    if comm is None:
        comm = Comm()
    elif not isinstance(comm, Comm):
        raise TypeError(f"comm must be an sbfunc.distributed.Comm, got {comm!r}")
    return (LocalScope if kind == "local" else GlobalScope)(comm, rebalance)
