"""Which rows one selection ranges over under data parallelism: policy wrappers.

:func:`local_selection` and :func:`global_selection` turn any policy of
:mod:`sbfunc.policies` into a policy for data-parallel training (``policy -> policy``); pass
the result to ``SelectiveBackprop(policy=...)``. Each rank scores its own rows, then:

* **local** (Composer's): each rank keeps its own fraction of its own rows, drawing from its
  own stream (the key folded with the rank). A stateless policy needs no communication at
  all. A policy with state (loss tables, a loss history) must see every rank's rows to stay
  identical on every rank: the ranks all-gather their scores (and ids), and every rank replays
  every rank's selection in rank order, keeping its own. The policy then evolves as in one
  process that saw the ranks' shards one after another.
* **global** (InfoBatch's): the ranks all-gather their scores (and ids) and every rank runs one
  selection over the global batch with the **same** key, so every rank computes the same
  selection and the same policy state; each keeps the selected rows it holds.

With ``rebalance=True`` the kept rows then move between ranks (one ``all_to_all_single``) so
that every rank backpropagates the same count (to one row): the wrapper's ``Policy.prune``
does the selecting and the moving. Whenever the wrapper communicates, row counts are read on
the host (a device sync under NCCL): every rank's row count (``_Scope._counts``) and, for a
global selection, where each rank's kept rows start (``_Global.choose``). A world of one, and
a local selection of a stateless policy without rebalancing, read nothing. A wrapped policy
scores every row (no ``score_rows``) and records no training losses (no ``record``: one rank's
training losses would make the per-id tables differ across ranks). Non-finite scores follow
the rule of :mod:`sbfunc.select` over the rows each selection ranges over.

A policy that reads per-row signals (``Policy.needs``, see :mod:`sbfunc.score`) gets
them like the scores: whenever the wrapper gathers, the signals it needs travel as extra
columns of the same one all-gather (:func:`~sbfunc.distributed.pack_rows`, any dtypes), so a
local selection replays every rank's shard with that rank's signals and a global selection
reads the signals of the global batch, concatenated in rank order. Per rank that adds, to the
``N`` scores (and ids), ``N * C`` logits, ``N * D`` features and ``N`` targets for a policy
that needs all three (``N (C + D)`` floats and ``N`` int64 targets: ``N (4 (C + D) + 8)``
bytes in float32, received from each of the ``W - 1`` other ranks); the rebalancing exchange
moves batch rows only, never signals. A world of one and a local selection of a stateless
policy hand the signals to the policy as they are, moving nothing. Signals that a policy
needs but are missing raise before any collective, on every rank alike.
"""

from __future__ import annotations

from itertools import accumulate, pairwise
from typing import Any

import optree
import torch

from sbfunc import random as sbrandom
from sbfunc.batch import take
from sbfunc.distributed._balance import exchange_plan
from sbfunc.distributed._comm import Comm
from sbfunc.distributed._packing import batch_rows, pack_rows, unpack_rows, with_rows
from sbfunc.policies import Policy, PolicyState, SelectArgs, check_scores, select_args
from sbfunc.score import SIGNALS, Signals, check_signals
from sbfunc.select import Selection
from sbfunc.types import PerSample

__all__ = ["global_selection", "local_selection"]

_Chosen = tuple[Selection, PolicyState, list[int] | None]
"""This rank's selection, the next state, and every rank's kept count when known."""

_Shard = tuple[torch.Tensor, torch.Tensor | None, Signals | None]
"""One rank's scores, ids and the signals the policy needs, as gathered."""


def _has_tensors(tree: Any) -> bool:
    return any(isinstance(x, torch.Tensor) for x in optree.tree_leaves(tree))


def _concat_signals(shards: list[Signals | None]) -> Signals | None:
    """The signals of the global batch: each gathered field concatenated in rank order."""
    first = shards[0]
    if first is None:
        return None
    return Signals(
        *(
            None if f is None else torch.cat([getattr(g, name) for g in shards])
            for name, f in zip(Signals._fields, first, strict=True)
        )
    )


class _Scope:
    kind = ""

    def __init__(self, policy: Policy, comm: Comm, rebalance: bool) -> None:
        self.policy, self.comm, self.rebalance = policy, comm, rebalance

    def __repr__(self) -> str:
        return (
            f"{self.kind}_selection({self.policy!r}, rebalance={self.rebalance}, "
            f"comm={self.comm!r})"
        )

    def choose(
        self,
        scores: torch.Tensor,
        state: PolicyState,
        a: SelectArgs,
    ) -> _Chosen:
        raise NotImplementedError

    def _inner(
        self,
        scores: torch.Tensor,
        state: PolicyState,
        a: SelectArgs,
    ) -> tuple[Selection, PolicyState]:
        extra: dict[str, Any] = {"signals": a.signals} if self.policy.needs else {}  # 1.0: none
        return self.policy.select(
            scores, state, key=a.key, ids=a.ids, epoch=a.epoch, elapsed=a.elapsed, **extra
        )

    def select(
        self, scores: torch.Tensor, state: PolicyState, /, **kwargs: Any
    ) -> tuple[Selection, PolicyState]:
        """This rank's rows of the selection (``Policy.select``)."""
        a = select_args(**kwargs)
        check_scores(scores)
        if a.scored is not None:
            raise ValueError(f"{self.kind}_selection scores every row: pass scored=None")
        a = a._replace(signals=self._needed(scores, a.signals))
        sel, state, _ = self.choose(scores, state, a)
        return sel, state

    def prune(
        self,
        batch: Any,
        scores: torch.Tensor,
        state: PolicyState,
        /,
        *,
        per_sample: PerSample = None,
        **kwargs: Any,
    ) -> tuple[Any, torch.Tensor | None, torch.Tensor, PolicyState]:
        """Select, take this rank's rows and move kept rows between ranks (``Policy.prune``)."""
        a = select_args(**kwargs)
        if per_sample is not None:
            raise ValueError(
                "per_sample is not supported with rebalance=True yet (rows are packed and "
                "exchanged by the default rule); leave one of them out"
            )
        check_scores(scores)
        a = a._replace(signals=self._needed(scores, a.signals))
        sel, state, kept = self.choose(scores, state, a)
        rows, weights = take(batch, sel.indices), sel.weights
        if self.comm.world == 1:
            return rows, weights, sel.indices, state
        if kept is None:
            kept = self._counts(sel.indices.shape[0], scores.device)
        plan = exchange_plan(kept, self.comm.rank)
        leaves = batch_rows(rows)
        cols = leaves if weights is None else [*leaves, weights.to(leaves[0].device)]
        packed, layout = pack_rows(cols)
        moved = unpack_rows(self.comm.all_to_all(packed, plan.send, plan.receive), layout)
        new_weights = None if weights is None else moved.pop().to(weights.device)
        return with_rows(rows, moved), new_weights, sel.indices, state

    def _counts(self, n: int, device: torch.device) -> list[int]:
        """Every rank's ``n``, in rank order (a host read)."""
        if self.comm.world == 1:
            return [n]
        mine = torch.tensor([n], dtype=torch.int64, device=device)
        return self.comm.all_gather(mine, purpose="sizes").tolist()

    def _needed(self, scores: torch.Tensor, signals: Signals | None) -> Signals | None:
        """``signals`` checked to hold every signal the policy needs, before any collective
        (every rank raises alike instead of one rank waiting in a gather)."""
        if not self.policy.needs:
            return signals
        return check_signals(signals, self.policy.needs, scores.shape[0])

    def _gather(
        self, scores: torch.Tensor, ids: torch.Tensor | None, signals: Signals | None
    ) -> tuple[list[int], list[_Shard]]:
        """Every rank's row count and ``(scores, ids, signals)``, in rank order: the signals
        the policy needs travel as extra columns of the one all-gather."""
        names = [name for name in SIGNALS if name in self.policy.needs]
        sizes = self._counts(scores.shape[0], scores.device)
        extra = [getattr(signals, name).to(scores.device) for name in names]
        cols = [scores, *([] if ids is None else [ids.to(scores.device)]), *extra]
        packed, layout = pack_rows(cols)
        most = max(sizes)
        if packed.shape[0] < most:  # uneven shards: pad to the longest, drop the padding below
            packed = torch.cat(
                [packed, packed.new_zeros(most - packed.shape[0], layout.row_bytes)]
            )
        gathered = self.comm.all_gather(packed, purpose="scores")
        out: list[_Shard] = []
        for r, n in enumerate(sizes):
            parts = unpack_rows(gathered[r * most : r * most + n], layout)
            s, *rest = parts
            i = None if ids is None else rest.pop(0)
            out.append((s, i, Signals(**dict(zip(names, rest, strict=True))) if names else None))
        return sizes, out


class _Local(_Scope):
    kind = "local"

    def choose(
        self,
        scores: torch.Tensor,
        state: PolicyState,
        a: SelectArgs,
    ) -> _Chosen:
        comm = self.comm
        if comm.world == 1 or not _has_tensors(state):
            mine = a._replace(key=sbrandom.fold_in(a.key, comm.rank))
            sel, state = self._inner(scores, state, mine)
            return sel, state, None
        _, shards = self._gather(scores, a.ids, a.signals)
        kept, chosen = [], None
        for r, (s, i, g) in enumerate(shards):  # every rank replays every shard, in rank order
            shard = a._replace(key=sbrandom.fold_in(a.key, r), ids=i, signals=g)
            sel, state = self._inner(s, state, shard)
            kept.append(sel.indices.shape[0])
            chosen = sel if r == comm.rank else chosen
        assert chosen is not None
        return chosen, state, kept


class _Global(_Scope):
    kind = "global"

    def choose(
        self,
        scores: torch.Tensor,
        state: PolicyState,
        a: SelectArgs,
    ) -> _Chosen:
        if self.comm.world == 1:  # the global batch is this rank's: no bounds to read
            sel, state = self._inner(scores, state, a)
            return sel, state, [sel.indices.shape[0]]
        sizes, shards = self._gather(scores, a.ids, a.signals)
        g_scores = torch.cat([s for s, _, _ in shards])
        g_ids = None if a.ids is None else torch.cat([i for _, i, _ in shards if i is not None])
        g_signals = _concat_signals([g for _, _, g in shards])
        sel, state = self._inner(g_scores, state, a._replace(ids=g_ids, signals=g_signals))
        offsets = [0, *accumulate(sizes)]
        # Selection indices are sorted: each rank's kept rows are one stretch of them.
        edges = torch.tensor(offsets, dtype=sel.indices.dtype, device=sel.indices.device)
        bounds: list[int] = torch.searchsorted(sel.indices, edges).tolist()
        lo, hi = bounds[self.comm.rank], bounds[self.comm.rank + 1]
        local = sel.indices[lo:hi] - offsets[self.comm.rank]
        weights = None if sel.weights is None else sel.weights[lo:hi]
        kept = [b - a for a, b in pairwise(bounds)]
        return Selection(local, weights), state, kept


def _wrap(scope: type[_Scope], policy: Policy, rebalance: bool, comm: Comm | None) -> Policy:
    if not isinstance(policy, Policy):
        raise TypeError(
            f"policy must be an sbfunc.policies.Policy (e.g. sbfunc.policies.rank_power(0.5)), "
            f"got {policy!r:.80}"
        )
    if policy.prune is not None:
        raise ValueError(f"policy is already a data-parallel selection ({policy.prune!r:.80})")
    if not isinstance(rebalance, bool):
        raise TypeError(f"rebalance must be True or False, got {rebalance!r}")
    if comm is None:
        comm = Comm()
    elif not isinstance(comm, Comm):
        raise TypeError(f"comm must be an sbfunc.distributed.Comm, got {comm!r}")
    s = scope(policy, comm, rebalance)
    return Policy(policy.init, s.select, prune=s.prune if rebalance else None, needs=policy.needs)


def local_selection(
    policy: Policy, *, rebalance: bool = False, comm: Comm | None = None
) -> Policy:
    """``policy`` applied by every rank to its own rows (see the module docs).

    Args:
        policy: a :class:`~sbfunc.policies.Policy`.
        rebalance: move kept rows between ranks so every rank backpropagates the same count
            (to one row).
        comm: the :class:`Comm` (process group and traffic meter); default ``Comm()``.

    Returns:
        A :class:`~sbfunc.policies.Policy` with ``policy``'s state.

    Raises:
        TypeError: for a ``policy`` that is not a ``Policy``, a ``rebalance`` that is not a
            bool or a ``comm`` that is not a ``Comm``.
        ValueError: for a ``policy`` that is already a data-parallel selection.

    Example:
        >>> from sbfunc.distributed import local_selection
        >>> policy = local_selection(sbfunc.policies.top_k(0.5))
        >>> sel, _ = policy.select(torch.tensor([0.1, 2.0, 0.3, 5.0]), policy.init(),
        ...                        key=sbfunc.random.key(0))  # one process: its own rows
        >>> sel.indices
        tensor([1, 3])

    References:
        MosaicML Composer ``SelectiveBackprop`` (each rank selects from its own rows).
    """
    return _wrap(_Local, policy, rebalance, comm)


def global_selection(
    policy: Policy, *, rebalance: bool = False, comm: Comm | None = None
) -> Policy:
    """``policy`` applied once to the rows of all ranks (see the module docs).

    Args:
        policy: a :class:`~sbfunc.policies.Policy`.
        rebalance: move kept rows between ranks so every rank backpropagates the same count
            (to one row).
        comm: the :class:`Comm` (process group and traffic meter); default ``Comm()``.

    Returns:
        A :class:`~sbfunc.policies.Policy` with ``policy``'s state.

    Raises:
        TypeError: for a ``policy`` that is not a ``Policy``, a ``rebalance`` that is not a
            bool or a ``comm`` that is not a ``Comm``.
        ValueError: for a ``policy`` that is already a data-parallel selection.

    Example:
        >>> from sbfunc.distributed import global_selection
        >>> model = torch.nn.Linear(4, 3)
        >>> loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy)
        >>> policy = global_selection(sbfunc.policies.rank_power(0.5), rebalance=True)
        >>> sb = sbfunc.SelectiveBackprop(0.0, 1.0, interrupt=0, policy=policy)
        >>> sb = sb.for_step(loss_fn=loss_fn, per_sample=None)  # what the step does
        >>> batch = (torch.randn(8, 4), torch.randint(0, 3, (8,)))
        >>> ctx = sbfunc.Context(sbfunc.random.key(0), *sbfunc.split_module(model), batch=batch)
        >>> ctx = ctx.replace(own=sb.init(sbfunc.random.key(1)))
        >>> sb.apply(sbfunc.Event.AFTER_DATALOADER, ctx).batch[0].shape  # one process here
        torch.Size([4, 4])

    References:
        Qin et al. 2024, "InfoBatch: Lossless Training Speed Up by Unbiased Dynamic Data
        Pruning" (global selection from all-gathered losses).
    """
    return _wrap(_Global, policy, rebalance, comm)
