"""The data-parallel training step: :func:`sbfunc.make_train_step` with gradients averaged
over the ranks.

Each rank runs the ordinary step on its shard of the global batch. Between ``BEFORE_BACKWARD``
and ``AFTER_BACKWARD`` (the step's ``synchronize`` hook) the ranks all-reduce, in buckets,
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

from collections.abc import Sequence
from typing import Any, Literal

import torch

from sbfunc import random as sbrandom
from sbfunc.distributed.comm import DEFAULT_BUCKET_BYTES, Comm
from sbfunc.engine import Algorithm, Carry, TrainState
from sbfunc.engine.ordering import DEFAULT_PASSES, Pass
from sbfunc.module import LossFn, Params
from sbfunc.optim import GradientTransformation
from sbfunc.step import StepMetrics, TrainStep, make_train_step
from sbfunc.validation import check_real

__all__ = ["BufferSync", "DataParallelStep", "make_data_parallel_step"]

BufferSync = Literal["broadcast", "mean"]


class DataParallelStep(TrainStep):
    """A :class:`~sbfunc.TrainStep` whose gradients and loss are averaged over the ranks of a
    :class:`Comm`; build it with :func:`make_data_parallel_step`.

    Example:
        >>> from sbfunc.distributed import make_data_parallel_step
        >>> ce = torch.nn.functional.cross_entropy
        >>> loss_fn = sbfunc.per_sample_loss(torch.nn.Linear(2, 2), ce)
        >>> step = make_data_parallel_step(loss_fn, sbfunc.optim.sgd(0.1))
        >>> step.comm.world  # no process group in this doctest: a world of one
        1

    References:
        PyTorch ``DistributedDataParallel`` (bucketed gradient all-reduce, buffers broadcast
        from rank 0); Goyal et al. 2017, "Accurate, Large Minibatch SGD".
    """

    collective = True

    def __init__(
        self,
        base: TrainStep,
        comm: Comm,
        bucket_bytes: int,
        buffers: BufferSync,
    ) -> None:
        super().__init__(
            base.loss_fn,
            base.optimizer,
            base.algorithms,
            base.passes,
            base.nonfinite,
            base.keyed_model,
        )
        self.comm, self.bucket_bytes, self.buffer_sync = comm, bucket_bytes, buffers

    def init(
        self,
        params: Params,
        buffers: Params,
        *,
        key: torch.Tensor,
        total_steps: int | None = None,
    ) -> TrainState:
        """Like :meth:`TrainStep.init`, after taking rank 0's ``params``, ``buffers`` and
        ``key`` on every rank (as DDP broadcasts the module at construction)."""
        sbrandom.check_key(key, "key")
        if isinstance(params, dict) and isinstance(buffers, dict) and self.comm.world > 1:
            values = [*params.values(), *buffers.values(), key]
            if all(isinstance(v, torch.Tensor) for v in values):
                out = self.comm.broadcast(values, bucket_bytes=self.bucket_bytes, purpose="init")
                params = dict(zip(params, out[: len(params)], strict=True))
                buffers = dict(zip(buffers, out[len(params) : -1], strict=True))
                key = out[-1]
        return super().init(params, buffers, key=key, total_steps=total_steps)

    def model_key(self, step_key: torch.Tensor) -> torch.Tensor:
        """Each rank's own dropout stream: the single-process key folded with the rank."""
        return sbrandom.fold_in(super().model_key(step_key), self.comm.rank)

    def synchronize(
        self, carry: Carry, grads: Params, loss: torch.Tensor, rows: int
    ) -> tuple[Carry, Params, torch.Tensor, torch.Tensor | None]:
        """The mean over all ranks' kept rows of the gradient and the loss (see the module
        docs); the buffers synchronised; apply the update unless no rank had a row."""
        stats = torch.stack(
            [loss.detach().to(torch.float32), torch.ones_like(loss, dtype=torch.float32)]
        )
        summed = self.comm.all_reduce_sum(
            [*grads.values(), stats], scale=rows, bucket_bytes=self.bucket_bytes
        )
        loss_sum, count = summed[-1][0], summed[-1][1]
        divided = torch._foreach_div(summed[:-1], count.clamp_min(1)) if grads else []
        grads = dict(zip(grads, divided, strict=True))
        context = carry.context._replace(buffers=self._sync_buffers(carry.context.buffers))
        return carry._replace(context=context), grads, (loss_sum / count).to(loss.dtype), count > 0

    def _sync_buffers(self, buffers: Params) -> Params:
        if not buffers or self.comm.world == 1:
            return buffers
        names = list(buffers)
        if self.buffer_sync == "broadcast":
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

    @torch.compiler.disable
    def finish(self, state: TrainState, carry: Carry, out: Any) -> tuple[TrainState, StepMetrics]:
        """Like :meth:`TrainStep.finish`; with ``nonfinite="raise"`` every rank raises when
        any rank had rows (the skip flag is the same on every rank)."""
        if self.nonfinite == "raise" and bool(out.skipped):
            had_rows = torch.full(
                (1,), float(out.samples_backpropagated > 0), device=out.loss.device
            )
            if bool(self.comm.all_reduce_sum([had_rows], purpose="checks")[0] > 0):
                raise FloatingPointError(
                    f"step {state.time.step}: the loss or a gradient is not finite on some "
                    f"rank (global loss {float(out.loss)}); the update was not applied on any "
                    "rank. Pass nonfinite='skip' to skip such updates and count them instead"
                )
        return super().finish(state, carry, out)


def make_data_parallel_step(
    loss_fn: LossFn,
    optimizer: GradientTransformation,
    algorithms: Sequence[Algorithm] = (),
    passes: Sequence[Pass] = DEFAULT_PASSES,
    *,
    comm: Comm | None = None,
    bucket_mb: float = DEFAULT_BUCKET_BYTES / 2**20,
    buffers: BufferSync = "broadcast",
    nonfinite: Literal["skip", "raise", "allow"] = "skip",
    keyed_model: bool | None = None,
) -> DataParallelStep:
    """:func:`sbfunc.make_train_step` for data parallelism: every rank calls
    ``step(state, batch)`` on its own shard; gradients and loss are the mean over all ranks'
    kept rows (see the module docs).

    ``step.init`` takes rank 0's parameters, buffers and key on every rank. Every random draw
    of an algorithm derives from that shared key, so a global selection draws the same on every
    rank; wrap algorithms that must draw differently per rank (augmentations) in
    :func:`per_rank`. Dropout draws per rank. ``state.time``'s sample counters count this
    rank's rows; everything else in the state is identical on every rank, except refill queues
    (see :func:`sbfunc.distributed.save`). ``torch.compile(step)`` works: the all-reduce is
    traced as functional collectives.

    Args:
        loss_fn: as for :func:`sbfunc.make_train_step`.
        optimizer: as for :func:`sbfunc.make_train_step`.
        algorithms: as for :func:`sbfunc.make_train_step`.
        passes: as for :func:`sbfunc.make_train_step`.
        nonfinite: as for :func:`sbfunc.make_train_step`.
        keyed_model: as for :func:`sbfunc.make_train_step`.
        comm: the :class:`Comm` (process group and traffic meter); default ``Comm()``.
        bucket_mb: the gradient bucket size in MiB (DDP's ``bucket_cap_mb``), > 0.
        buffers: how buffers (BatchNorm statistics) agree after each step: ``"broadcast"``
            rank 0's (DDP's ``broadcast_buffers``) or ``"mean"`` of the floating ones.

    Returns:
        A :class:`DataParallelStep`.

    Raises:
        TypeError, ValueError: as :func:`sbfunc.make_train_step`, and for the arguments above.

    Example:
        >>> from sbfunc.distributed import make_data_parallel_step
        >>> model = torch.nn.Linear(4, 3)
        >>> loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy, train=True)
        >>> step = make_data_parallel_step(loss_fn, sbfunc.optim.sgd(0.1))
        >>> state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))
        >>> state, metrics = step(state, (torch.randn(8, 4), torch.randint(0, 3, (8,))))
        >>> state.time.step, metrics.samples_backpropagated
        (1, 8)

    References:
        PyTorch ``DistributedDataParallel`` (``bucket_cap_mb``, ``broadcast_buffers``); Li et
        al. 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel Training".
    """
    base = make_train_step(
        loss_fn, optimizer, algorithms, passes, nonfinite=nonfinite, keyed_model=keyed_model
    )
    if comm is None:
        comm = Comm()
    elif not isinstance(comm, Comm):
        raise TypeError(f"comm must be an sbfunc.distributed.Comm, got {comm!r}")
    check_real(bucket_mb, "bucket_mb", low=0, open_low=True)
    if buffers not in ("broadcast", "mean"):
        raise ValueError(f"buffers must be 'broadcast' or 'mean', got {buffers!r}")
    return DataParallelStep(base, comm, max(1, int(bucket_mb * 2**20)), buffers)
