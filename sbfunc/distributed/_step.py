"""Data parallelism for the training step: :class:`DataParallel`, the step's ``replicas``
component (:mod:`sbfunc.step`), with gradients averaged over the ranks.

Each rank runs the ordinary step on its shard of the global batch. Between ``BEFORE_BACKWARD``
and ``AFTER_BACKWARD`` (:meth:`DataParallel.mean`) the ranks all-reduce, in buckets,
``k_r * g_r`` and ``k_r * L_r``, where ``k_r`` is the number of rows rank ``r`` backpropagated
and ``g_r``, ``L_r`` its gradient and loss (means over its rows); dividing by ``K = sum k_r``
(summed in the same all-reduce) gives the gradient and loss of the **mean over all kept rows**,
however selection split them. So ``AFTER_BACKWARD`` algorithms (gradient clipping) and the
optimizer see the same gradient on every rank and the parameters stay identical, and a rank
left with no row (a global selection that kept none of its rows, a refill queue still
filling) contributes zero and still applies the update. Only when no rank has a row (``K = 0``)
is the update skipped, on every rank.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import torch

from sbfunc import random as sbrandom
from sbfunc.distributed._comm import DEFAULT_BUCKET_BYTES, Comm
from sbfunc.engine import DEFAULT_PASSES, Algorithm, Pass
from sbfunc.optim import GradientTransformation
from sbfunc.step import TrainStep, make_train_step
from sbfunc.types import LossFn, Params
from sbfunc.validation import check_real

__all__ = ["BufferSync", "DataParallel", "make_data_parallel_step"]

BufferSync = Literal["broadcast", "mean"]


@dataclasses.dataclass(frozen=True)
class DataParallel:
    """Data parallelism for a training step: pass it as ``make_train_step(...,
    replicas=DataParallel(...))`` (or build the step with :func:`make_data_parallel_step`).

    The step's :class:`~sbfunc.step.Replicas` component: the gradient and loss become
    the mean over every rank's kept rows (see the module docs), the buffers agree after each
    step, ``step.init`` starts every rank from rank 0's parameters, buffers and key, dropout
    draws per rank, and a rank left with no row still runs the step's collective.

    Args:
        comm: the :class:`Comm` (process group and traffic meter); ``None``: ``Comm()``.
        bucket_mb: the gradient bucket size in MiB (DDP's ``bucket_cap_mb``), > 0.
        buffers: how buffers (BatchNorm statistics) agree after each step: ``"broadcast"``
            rank 0's (DDP's ``broadcast_buffers``) or ``"mean"`` of the floating ones.

    Raises:
        TypeError: if ``comm`` is not a :class:`Comm`.
        ValueError: if ``bucket_mb <= 0`` or ``buffers`` is not one of its values.

    Example:
        >>> from sbfunc.distributed import DataParallel
        >>> ce = torch.nn.functional.cross_entropy
        >>> loss_fn = sbfunc.per_sample_loss(torch.nn.Linear(2, 2), ce)
        >>> step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1), replicas=DataParallel())
        >>> step.replicas.comm.world  # no process group in this doctest: a world of one
        1

    References:
        PyTorch ``DistributedDataParallel`` (bucketed gradient all-reduce, buffers broadcast
        from rank 0); Goyal et al. 2017, "Accurate, Large Minibatch SGD".
    """

    comm: Comm = dataclasses.field(default_factory=Comm)
    bucket_mb: float = DEFAULT_BUCKET_BYTES / 2**20
    buffers: BufferSync = "broadcast"

    collective: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if not isinstance(self.comm, Comm):
            raise TypeError(f"comm must be an sbfunc.distributed.Comm, got {self.comm!r}")
        check_real(self.bucket_mb, "bucket_mb", low=0, open_low=True)
        if self.buffers not in ("broadcast", "mean"):
            raise ValueError(f"buffers must be 'broadcast' or 'mean', got {self.buffers!r}")

    @property
    def bucket_bytes(self) -> int:
        """The bucket size in bytes."""
        return max(1, int(self.bucket_mb * 2**20))

    def share(
        self, params: Params, buffers: Params, key: torch.Tensor
    ) -> tuple[Params, Params, torch.Tensor]:
        """Rank 0's ``params``, ``buffers`` and ``key`` on every rank (as DDP broadcasts the
        module at construction)."""
        if self.comm.world == 1:
            return params, buffers, key
        values = [*params.values(), *buffers.values(), key]
        out = self.comm.broadcast(values, bucket_bytes=self.bucket_bytes, purpose="init")
        params = dict(zip(params, out[: len(params)], strict=True))
        buffers = dict(zip(buffers, out[len(params) : -1], strict=True))
        return params, buffers, out[-1]

    def model_key(self, key: torch.Tensor) -> torch.Tensor:
        """Each rank's own dropout stream: the single-process key folded with the rank."""
        return sbrandom.fold_in(key, self.comm.rank)

    def mean(
        self, grads: Params, loss: torch.Tensor, rows: int
    ) -> tuple[Params, torch.Tensor, torch.Tensor | None]:
        """The mean over all ranks' kept rows of the gradient and the loss (see the module
        docs); apply the update unless no rank had a row."""
        stats = torch.stack(
            [loss.detach().to(torch.float32), torch.ones_like(loss, dtype=torch.float32)]
        )
        summed = self.comm.all_reduce_sum(
            [*grads.values(), stats], scale=rows, bucket_bytes=self.bucket_bytes
        )
        loss_sum, count = summed[-1][0], summed[-1][1]
        divided = torch._foreach_div(summed[:-1], count.clamp_min(1)) if grads else []
        grads = dict(zip(grads, divided, strict=True))
        return grads, (loss_sum / count).to(loss.dtype), count > 0

    def sync_buffers(self, buffers: Params) -> Params:
        """Rank 0's buffers, or the mean of the floating ones (``buffers="mean"``)."""
        if not buffers or self.comm.world == 1:
            return buffers
        names = list(buffers)
        if self.buffers == "broadcast":
            out = self.comm.broadcast(
                list(buffers.values()), bucket_bytes=self.bucket_bytes, purpose="buffers"
            )
            return dict(zip(names, out, strict=True))
        floats = [k for k in names if buffers[k].is_floating_point()]
        others = [k for k in names if k not in floats]
        mean = self.comm.all_reduce_sum(
            [buffers[k] for k in floats], bucket_bytes=self.bucket_bytes, purpose="buffers"
        )
        rest = self.comm.broadcast(
            [buffers[k] for k in others], bucket_bytes=self.bucket_bytes, purpose="buffers"
        )
        new = {k: v / self.comm.world for k, v in zip(floats, mean, strict=True)}
        new.update(zip(others, rest, strict=True))
        return {k: new[k] for k in names}

    def any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` holds on some rank (one small all-reduce)."""
        if self.comm.world == 1:
            return flag
        count = torch.full((1,), float(flag), device=self.comm.device)
        return bool(self.comm.all_reduce_sum([count], purpose="checks")[0] > 0)


def make_data_parallel_step(
    loss_fn: LossFn,
    optimizer: GradientTransformation,
    algorithms: Sequence[Algorithm] = (),
    passes: Sequence[Pass] = DEFAULT_PASSES,
    *,
    comm: Comm | None = None,
    bucket_mb: float = DEFAULT_BUCKET_BYTES / 2**20,
    buffers: BufferSync = "broadcast",
    **options: Any,
) -> TrainStep:
    """:func:`sbfunc.make_train_step` with ``replicas=DataParallel(comm, bucket_mb, buffers)``:
    every rank calls ``step(state, batch)`` on its own shard; gradients and loss are the mean
    over all ranks' kept rows (see the module docs).

    ``step.init`` takes rank 0's parameters, buffers and key on every rank. Every random draw
    of an algorithm derives from that shared key, so a global selection draws the same on every
    rank; wrap algorithms that must draw differently per rank (augmentations) in
    :func:`per_rank`. Dropout draws per rank. ``state.time``'s sample counters count this
    rank's rows; everything else in the state is identical on every rank, except refill queues
    (see :func:`sbfunc.distributed.save_data_parallel`). Compiled (``torch.compile(step)``,
    tested on two ranks) the all-reduce is traced as functional collectives. Microbatching
    accumulates each rank's chunks first, then all-reduces once.

    Args:
        loss_fn: as for :func:`sbfunc.make_train_step` (so are ``optimizer``, ``algorithms``,
            ``passes`` and the ``options``).
        optimizer: the gradient transformation.
        algorithms: the algorithms to run.
        passes: the ordering passes.
        comm: the :class:`Comm`; ``None``: ``Comm()`` (as for :class:`DataParallel`).
        bucket_mb: the gradient bucket size in MiB, > 0.
        buffers: ``"broadcast"`` or ``"mean"`` (see :class:`DataParallel`).
        **options: :func:`sbfunc.make_train_step`'s keyword options (``nonfinite``,
            ``keyed_model``, ``microbatching``: each rank's kept rows split, ``per_sample``,
            ``precision``, ``objective``); ``replicas`` is this function's.

    Returns:
        A :class:`~sbfunc.step.TrainStep` whose ``replicas`` is the :class:`DataParallel`.

    Raises:
        TypeError, ValueError: as :func:`sbfunc.make_train_step` and :class:`DataParallel`.

    Example:
        >>> from sbfunc.distributed import make_data_parallel_step
        >>> model = torch.nn.Linear(4, 3)
        >>> loss_fn = sbfunc.per_sample_loss(
        ...     model, torch.nn.functional.cross_entropy, mode="train")
        >>> step = make_data_parallel_step(loss_fn, sbfunc.optim.sgd(0.1))
        >>> state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))
        >>> state, metrics = step(state, (torch.randn(8, 4), torch.randint(0, 3, (8,))))
        >>> state.time.step, metrics.samples_backpropagated
        (1, 8)

    References:
        PyTorch ``DistributedDataParallel`` (``bucket_cap_mb``, ``broadcast_buffers``); Li et
        al. 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel Training".
    """
    if "replicas" in options:
        raise TypeError("make_data_parallel_step makes its own replicas (comm=, bucket_mb=, ...)")
    replicas = DataParallel(Comm() if comm is None else comm, bucket_mb, buffers)
    return make_train_step(loss_fn, optimizer, algorithms, passes, replicas=replicas, **options)
