"""Selection wrappers of policies that read per-row signals (``Policy.needs``), over several
ranks: the ranks are threads of this process, each with a :class:`_ThreadComm` whose
collectives meet at a barrier, so that every rank holds its own (uneven) shard. A global
selection must equal the unwrapped policy on the concatenated batch, and a local selection of
a stateful policy the replay of the shards in rank order, bit for bit, signals included."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc import distributed as sbdist
from sbfunc import random as sbrandom
from sbfunc.distributed._comm import nbytes
from sbfunc.policies import Policy, SelectArgs, make_policy
from sbfunc.score import Signals
from sbfunc.select import Selection, kept_count
from sbfunc.types import EmptyState

NEEDS = {"logits", "features", "targets"}
KEY = sbrandom.key(3)


class _World:
    """What the ranks of one thread world share: a barrier and one slot per rank."""

    def __init__(self, world: int) -> None:
        self.barrier = threading.Barrier(world, timeout=20)
        self.slots: list[Any] = [None] * world


class _ThreadComm(sbdist.Comm):
    """Rank ``rank`` of a world of threads: each collective posts this rank's part and reads
    every rank's (two barriers: the slots are reused by the next collective)."""

    def __init__(self, shared: _World, rank: int) -> None:
        super().__init__(meter=sbdist.TrafficMeter())
        self.shared, self.rank, self.world = shared, rank, len(shared.slots)

    def _exchange(self, part: Any) -> list[Any]:
        self.shared.slots[self.rank] = part
        self.shared.barrier.wait()
        parts = list(self.shared.slots)
        self.shared.barrier.wait()
        return parts

    def all_gather(self, tensor: torch.Tensor, *, purpose: str = "gather") -> torch.Tensor:
        parts = self._exchange(tensor)
        assert all(p.shape == tensor.shape and p.dtype == tensor.dtype for p in parts)
        self._record(purpose, nbytes(tensor), (self.world - 1) * nbytes(tensor))
        return torch.cat(parts)

    def all_to_all(
        self,
        tensor: torch.Tensor,
        send: Sequence[int],
        receive: Sequence[int],
        *,
        purpose: str = "rebalance",
    ) -> torch.Tensor:
        parts = self._exchange((tensor, [int(s) for s in send]))
        got = [t[sum(s[: self.rank]) : sum(s[: self.rank + 1])] for t, s in parts]
        assert [g.shape[0] for g in got] == [int(r) for r in receive]
        return torch.cat(got)


def _on_ranks(world: int, fn: Callable[[sbdist.Comm], Any]) -> list[Any]:
    """``fn(comm)`` on every rank of a thread world, in rank order (an error is re-raised)."""
    shared, out = _World(world), [None] * world
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            out[r] = fn(_ThreadComm(shared, r))
        except BaseException as e:  # re-raised below
            errors.append(e)
            shared.barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


class _Shard(NamedTuple):
    scores: torch.Tensor
    ids: torch.Tensor
    signals: Signals


def _shards(sizes: Sequence[int], classes: int = 3, dim: int = 5, seed: int = 0) -> list[_Shard]:
    """Shards of ``sizes`` rows: float32 scores and logits, float64 features, int64 targets."""
    g = torch.Generator().manual_seed(seed)
    out, start = [], 0
    for n in sizes:
        logits = torch.randn(n, classes, generator=g)
        features = torch.randn(n, dim, generator=g, dtype=torch.float64)
        targets = torch.randint(0, classes, (n,), generator=g)
        ids = torch.arange(start, start + n)
        out.append(_Shard(torch.rand(n, generator=g), ids, Signals(logits, features, targets)))
        start += n
    return out


def _joined(shards: Sequence[_Shard]) -> _Shard:
    fields = zip(*(s.signals for s in shards), strict=True)
    return _Shard(
        torch.cat([s.scores for s in shards]),
        torch.cat([s.ids for s in shards]),
        Signals(*(torch.cat(list(f)) for f in fields)),
    )


def _top(priority: torch.Tensor, keep: float) -> Selection:
    k = kept_count(priority.shape[0], keep)
    return Selection(torch.sort(torch.topk(priority, k).indices).values)


def _largest_logits(keep: float = 0.5) -> Policy:
    """Stateless: the rows of largest logits norm (ties broken by the target)."""

    def rule(scores: torch.Tensor, state: Any, a: SelectArgs) -> tuple[Selection, Any]:
        s = a.signals
        assert s is not None and s.logits is not None and s.targets is not None
        return _top(s.logits.norm(dim=1) + 1e-3 * s.targets, keep), state

    return make_policy(EmptyState, rule, needs=NEEDS)


class _Sums(NamedTuple):
    features: torch.Tensor  # the sum of the kept rows' features
    targets: torch.Tensor  # a histogram of every row's target


def _feature_sum(keep: float = 0.5, classes: int = 3, dim: int = 5) -> Policy:
    """Stateful: the rows of largest logits norm plus their features' agreement with the sum
    of the features kept so far (so the order of the shards matters)."""

    def init() -> _Sums:
        return _Sums(torch.zeros(dim, dtype=torch.float64), torch.zeros(classes))

    def rule(scores: torch.Tensor, state: _Sums, a: SelectArgs) -> tuple[Selection, _Sums]:
        s = a.signals
        assert s is not None and s.features is not None and s.logits is not None
        assert s.targets is not None
        sel = _top(s.logits.norm(dim=1) + (s.features @ state.features).float(), keep)
        hist = torch.bincount(s.targets, minlength=classes).float()
        kept = s.features[sel.indices].sum(0)
        return sel, _Sums(state.features + kept, state.targets + hist)

    return make_policy(init, rule, needs=NEEDS)


POLICIES = {"largest_logits": _largest_logits, "feature_sum": _feature_sum}
divbs = getattr(sbfunc.policies, "divbs", None)
if divbs is not None:  # the DivBS policy, when it is in place
    POLICIES["divbs"] = lambda: divbs(0.5)


def _select(wrapped: Policy, shards: Sequence[_Shard], key: Any = KEY) -> list[Any]:
    def fn(comm: sbdist.Comm) -> Any:
        policy, shard = wrapped(comm), shards[comm.rank]
        return policy.select(
            shard.scores, policy.init(), key=key, ids=shard.ids, signals=shard.signals
        )

    return _on_ranks(len(shards), fn)


def _assert_same(a: Any, b: Any) -> None:
    la, lb = [torch.utils._pytree.tree_leaves(x) for x in (a, b)]
    assert len(la) == len(lb)
    for x, y in zip(la, lb, strict=True):
        assert torch.equal(torch.as_tensor(x), torch.as_tensor(y))


def _check_global(name: str, sizes: Sequence[int], seed: int = 0) -> None:
    shards, policy = _shards(sizes, seed=seed), POLICIES[name]()
    whole = _joined(shards)
    ref, ref_state = policy.select(
        whole.scores, policy.init(), key=KEY, ids=whole.ids, signals=whole.signals
    )
    ranks = _select(lambda c: sbdist.global_selection(POLICIES[name](), comm=c), shards)
    starts = [0, *torch.tensor(sizes).cumsum(0).tolist()]
    got = torch.cat([sel.indices + starts[r] for r, (sel, _) in enumerate(ranks)])
    assert torch.equal(got, ref.indices)
    for _, state in ranks:  # every rank evolves the policy alike
        _assert_same(state, ref_state)


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize("sizes", [(6, 6), (7, 3, 5), (4, 0, 4)])
def test_a_global_selection_equals_the_policy_on_the_concatenated_batch(name, sizes):
    _check_global(name, sizes)


@settings(max_examples=15, derandomize=True, database=None, deadline=None)
@given(sizes=st.lists(st.integers(0, 6), min_size=2, max_size=3), seed=st.integers(0, 99))
def test_global_selection_with_signals_over_any_shards(sizes, seed):
    _check_global("feature_sum", sizes, seed)


@pytest.mark.parametrize("sizes", [(6, 6), (7, 3, 5), (4, 0, 4)])
def test_a_local_selection_replays_every_shard_with_its_own_signals(sizes):
    shards, policy = _shards(sizes), _feature_sum()
    state, ref = policy.init(), []
    for r, s in enumerate(shards):  # the shards one after another, each with its own key
        sel, state = policy.select(
            s.scores, state, key=sbrandom.fold_in(KEY, r), ids=s.ids, signals=s.signals
        )
        ref.append(sel)
    ranks = _select(lambda c: sbdist.local_selection(_feature_sum(), comm=c), shards)
    for r, (sel, got_state) in enumerate(ranks):
        assert torch.equal(sel.indices, ref[r].indices)
        _assert_same(got_state, state)


def test_a_stateless_local_selection_moves_nothing_and_reads_its_own_signals():
    shards = _shards((5, 4))
    ranks = _on_ranks(2, lambda c: (c, _select_one(sbdist.local_selection, c, shards)))
    for r, (comm, (sel, _)) in enumerate(ranks):
        s = shards[r]
        want, _ = _largest_logits().select(s.scores, EmptyState(), key=KEY, signals=s.signals)
        assert torch.equal(sel.indices, want.indices)
        assert comm.meter.totals() == {}


def _select_one(wrap: Callable[..., Policy], comm: sbdist.Comm, shards: Sequence[_Shard]) -> Any:
    policy, s = wrap(_largest_logits(), comm=comm), shards[comm.rank]
    return policy.select(s.scores, policy.init(), key=KEY, signals=s.signals)


def test_the_signals_travel_in_the_one_gather_of_the_scores():
    classes, dim, n = 3, 5, 7
    shards = _shards((n, n - 2), classes, dim)
    comms = _on_ranks(2, lambda c: (_select_one(sbdist.global_selection, c, shards), c)[1])
    # float32 score, float32 logits, float64 features, int64 target: the longest shard's rows
    row_bytes = 4 + 4 * classes + 8 * dim + 8
    for comm in comms:
        totals = comm.meter.totals()
        assert set(totals) == {"sizes", "scores"}
        assert totals["scores"] == sbdist.gather_traffic(n, row_bytes, world=2)


@pytest.mark.parametrize("wrap", [sbdist.global_selection, sbdist.local_selection])
def test_rebalancing_moves_the_kept_rows_of_a_signal_policy(wrap):
    sizes = (8, 2, 6)
    shards, policy = _shards(sizes), _feature_sum()
    whole = _joined(shards)
    batch = [(s.ids.double(), s.signals.targets) for s in shards]

    def fn(comm: sbdist.Comm) -> Any:
        p, s = wrap(_feature_sum(), rebalance=True, comm=comm), shards[comm.rank]
        assert p.prune is not None
        return p.prune(batch[comm.rank], s.scores, p.init(), key=KEY, ids=s.ids, signals=s.signals)

    ranks = _on_ranks(len(sizes), fn)
    rows = [r[0][0] for r in ranks]
    assert max(len(r) for r in rows) - min(len(r) for r in rows) <= 1
    if wrap is sbdist.global_selection:  # the kept rows of the global batch, in order
        ref, _ = policy.select(whole.scores, policy.init(), key=KEY, signals=whole.signals)
        kept = whole.ids[ref.indices]
    else:  # each shard's kept rows, replayed in rank order
        state, parts = policy.init(), []
        for r, s in enumerate(shards):
            sel, state = policy.select(
                s.scores, state, key=sbrandom.fold_in(KEY, r), signals=s.signals
            )
            parts.append(s.ids[sel.indices])
        kept = torch.cat(parts)
    assert torch.equal(torch.cat(rows), kept.double())
    for r in ranks[1:]:
        _assert_same(r[3], ranks[0][3])


@pytest.mark.parametrize("wrap", [sbdist.global_selection, sbdist.local_selection])
@pytest.mark.parametrize("world", [1, 2])
def test_missing_signals_raise_before_any_collective(wrap, world):
    shards = _shards([4] * world)

    def fn(comm: sbdist.Comm) -> Any:
        p, s = wrap(_feature_sum(), comm=comm), shards[comm.rank]
        with pytest.raises(ValueError, match=r"reads the signal 'features'"):
            p.select(s.scores, p.init(), key=KEY, signals=s.signals._replace(features=None))
        with pytest.raises(ValueError, match=r"reads the signal"):
            p.select(s.scores, p.init(), key=KEY)
        with pytest.raises(ValueError, match=r"signals\.logits must have one row per score"):
            p.select(
                s.scores,
                p.init(),
                key=KEY,
                signals=s.signals._replace(logits=s.signals.logits[:2]),
            )
        return comm.meter.totals()

    assert all(totals == {} for totals in _on_ranks(world, fn))
