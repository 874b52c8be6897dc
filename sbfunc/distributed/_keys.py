"""Random streams under data parallelism: the same on every rank where the ranks must agree,
the rank's own where they must differ.

Every key of a step derives from the root key, the step, the algorithm's stream and the event
(:mod:`sbfunc.engine`), so with the root key shared by :meth:`DataParallelStep.init` every rank
draws the same numbers: what a global selection needs. An augmentation (CutOut, MixUp) drawing
the same numbers on every rank would apply the same crop or mixing to every shard; wrapped in
:func:`per_rank` it draws from its key folded with the rank, ``fold_in(key, rank)``, a stream
of its own on every rank that is still a pure function of the root key (so a run resumes bit
for bit on the same world size).
"""

from __future__ import annotations

from typing import Any

from sbfunc import random as sbrandom
from sbfunc.distributed._comm import Comm
from sbfunc.engine import FLAGS, Algorithm, ApplyResult, Context, Event, unpack_result
from sbfunc.validation import check_int

__all__ = ["per_rank", "rank_key"]


def rank_key(key: sbrandom.Key, rank: int) -> sbrandom.Key:
    """Rank ``rank``'s own stream of ``key``: ``fold_in(key, rank)``.

    Raises:
        ValueError: for a ``rank`` that is not an int >= 0.

    Example:
        >>> from sbfunc.distributed import rank_key
        >>> k = sbfunc.random.key(0)
        >>> torch.equal(rank_key(k, 0), rank_key(k, 1))
        False

    References:
        JAX ``jax.random.fold_in`` (per-device streams from one key).
    """
    check_int(rank, "rank", low=0)
    return sbrandom.fold_in(key, rank)


class _PerRank(Algorithm):
    """``part`` drawing from its key folded with the rank; same name, state and flags."""

    def __init__(self, part: Algorithm, rank: int) -> None:
        self.part, self.parts, self.rank = part, (part,), rank
        self.name = part.name
        for field in (*FLAGS, "uses_key", "uses_elapsed", "events"):
            setattr(self, field, getattr(part, field))

    def init(self, key: Any) -> Any:
        return self.part.init(key)  # the same state on every rank

    def for_step(self, *, loss_fn: Any, per_sample: Any) -> Algorithm:
        part = self.part.for_step(loss_fn=loss_fn, per_sample=per_sample)
        return self if part is self.part else _PerRank(part, self.rank)

    def match(self, event: Event, ctx: Context) -> Any:
        return self.part.match(event, ctx)

    def apply(self, event: Event, ctx: Context) -> ApplyResult:
        out, code = unpack_result(
            self.part.apply(event, ctx.replace(key=rank_key(ctx.key, self.rank))), self.part
        )
        out = out.replace(key=ctx.key)
        return out if code is None else (out, code)

    def __repr__(self) -> str:
        return f"per_rank({self.part!r}, rank={self.rank})"


def per_rank(algorithm: Algorithm, *, comm: Comm | None = None) -> Algorithm:
    """``algorithm`` drawing from a random stream of its own on every rank (see the module
    docs); its state, name and flags stay those of ``algorithm``.

    Args:
        algorithm: e.g. ``sbfunc.algorithms.CutOut(...)`` or ``sbfunc.algorithms.MixUp(...)``.
        comm: the :class:`Comm` whose rank folds into the key; default ``Comm()``.

    Raises:
        TypeError: if ``algorithm`` is not an ``Algorithm`` or ``comm`` not a ``Comm``.

    Example:
        >>> from sbfunc.distributed import per_rank
        >>> cutout = per_rank(sbfunc.algorithms.CutOut(length=0.5))
        >>> cutout.name, cutout.rank  # no process group in this doctest: rank 0
        ('CutOut', 0)

    References:
        JAX ``jax.random.fold_in``; PyTorch ``DistributedSampler`` (per-rank seeds).
    """
    if not isinstance(algorithm, Algorithm):
        raise TypeError(f"algorithm must be an sbfunc Algorithm, got {type(algorithm).__name__}")
    if comm is None:
        comm = Comm()
    elif not isinstance(comm, Comm):
        raise TypeError(f"comm must be an sbfunc.distributed.Comm, got {comm!r}")
    return _PerRank(algorithm, comm.rank)
