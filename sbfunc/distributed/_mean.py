"""Data parallelism as a gradient transformation: :func:`mean_across_ranks` averages the
updates over the ranks of a process group with the bucketed all-reduce of :class:`Comm`."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from sbfunc.distributed._comm import DEFAULT_BUCKET_BYTES, Comm
from sbfunc.distributed._meter import TrafficMeter
from sbfunc.optim import GradientTransformation, TransformRecord
from sbfunc.types import EmptyState, Params
from sbfunc.validation import check_int

__all__ = ["mean_across_ranks"]


@dataclasses.dataclass(frozen=True, repr=False)
class _MeanAcrossRanks(TransformRecord):
    comm: Comm
    bucket_bytes: int

    def init(self, params: Params) -> EmptyState:
        return EmptyState()

    def update(
        self, updates: Params, state: EmptyState, params: Params | None = None
    ) -> tuple[Params, EmptyState]:
        if self.comm.world == 1 or not updates:
            return dict(updates), state
        summed = self.comm.all_reduce_sum(
            list(updates.values()), bucket_bytes=self.bucket_bytes, purpose="gradients"
        )
        mean = torch._foreach_div(summed, self.comm.world)
        return dict(zip(updates, mean, strict=True)), state


def mean_across_ranks(
    group: Any = None,
    *,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    meter: TrafficMeter | None = None,
) -> GradientTransformation:
    """Average the updates over the ranks: ``u -> (u_0 + ... + u_{n-1}) / n``.

    One all-reduce per bucket of ``bucket_bytes`` (DDP's buckets, :meth:`Comm.all_reduce_sum`:
    every bucket in flight at once, ``torch.distributed`` eagerly and its traceable functional
    collectives under ``torch.compile``), then a division by the world size. The process group
    is read when the transformation is built (as :func:`make_data_parallel_step` does); without
    an initialised one, or in a world of one, the updates pass unchanged. Put it first in a
    chain, so that every rank runs the rest on the same gradient and the parameters stay equal.
    Every rank must call ``update`` with updates of the same keys, shapes and dtypes. This is a
    plain mean over ranks: the data-parallel step instead weights each rank by the rows it
    backpropagated (they differ when a selection keeps unequal numbers of rows per rank).

    Args:
        group: a ``torch.distributed`` process group; ``None`` for the default group (or a
            world of one when none is initialised).
        bucket_bytes: the bucket size in bytes, ``>= 1`` (default DDP's 25 MiB).
        meter: a :class:`TrafficMeter` recording the bytes moved, or ``None``.

    Returns:
        A :class:`~sbfunc.optim.GradientTransformation` with state
        :class:`~sbfunc.types.EmptyState`.

    Raises:
        TypeError: for arguments of the wrong type.
        ValueError: if ``group`` is given while ``torch.distributed`` is not initialised, or
            ``bucket_bytes < 1``.

    Example:
        >>> from sbfunc.distributed import mean_across_ranks
        >>> opt = sbfunc.optim.chain(mean_across_ranks(), sbfunc.optim.sgd(0.1))
        >>> params = {"w": torch.ones(2)}
        >>> opt.update({"w": torch.ones(2)}, opt.init(params), params)[0]  # a world of one
        {'w': tensor([-0.1000, -0.1000])}

    References:
        PyTorch ``DistributedDataParallel`` (bucketed gradient all-reduce); Li et al. 2020,
        "PyTorch Distributed: Experiences on Accelerating Data Parallel Training"; DeepMind
        optax / JAX ``jax.lax.pmean``.
    """
    size = check_int(bucket_bytes, "bucket_bytes", low=1)
    comm = Comm(group, meter=meter)
    return _MeanAcrossRanks(
        name="mean_across_ranks", comm=comm, bucket_bytes=size
    ).transformation()
