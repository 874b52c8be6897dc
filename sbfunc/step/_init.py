"""A training step's initial state, before its ``INIT`` event (``TrainStep.init``)."""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import torch

from sbfunc import random as sbrandom
from sbfunc.engine import Algorithm, Time, TrainState
from sbfunc.engine.internal import stream_ids
from sbfunc.module import check_state
from sbfunc.optim import GradientTransformation
from sbfunc.random import check_key
from sbfunc.step._replicas import Replicas
from sbfunc.types import LossFn, Params
from sbfunc.validation import check_int

__all__ = ["initial_state"]

_INIT_STREAM = zlib.crc32(b"sbfunc.init") | (1 << 41)  # never an algorithm's stream id


def initial_state(
    loss_fn: LossFn,
    optimizer: GradientTransformation,
    algorithms: Sequence[Algorithm],
    replicas: Replicas,
    params: Params,
    buffers: Params,
    *,
    key: torch.Tensor,
    total_steps: int | None,
) -> TrainState:
    """The checked initial :class:`~sbfunc.TrainState` of a step's pieces: the dicts shared
    by the ``replicas`` (and copied), the optimizer's and each algorithm's initial state (from
    the algorithm's own stream of ``key``), time zero (see ``TrainStep.init``).

    Example:
        >>> loss_fn = sbfunc.per_sample_loss(torch.nn.Linear(2, 2), torch.nn.functional.mse_loss)
        >>> from sbfunc.step import ONE_PROCESS
        >>> state = initial_state(loss_fn, sbfunc.optim.sgd(0.1), (), ONE_PROCESS,
        ...                       *sbfunc.split_module(loss_fn.module), key=sbfunc.random.key(0),
        ...                       total_steps=None)
        >>> state.time.step, sorted(state.params)
        (0, ['bias', 'weight'])
    """
    check_key(key, "key")
    check_state(loss_fn, params, buffers, training=True)
    if total_steps is not None:
        total_steps = check_int(total_steps, "total_steps", low=1)
    params, buffers, key = replicas.share(params, buffers, key)
    init_key = sbrandom.fold_in(key, _INIT_STREAM)
    streams = stream_ids([a.name for a in algorithms])
    states = tuple(
        alg.init(sbrandom.fold_in(init_key, s)) for alg, s in zip(algorithms, streams, strict=True)
    )
    zero = torch.zeros((), dtype=torch.int64, device=key.device)
    # two tensors, never one object twice (a compiled step would guard on the alias)
    time = Time(updates_skipped=zero, total_steps=total_steps, rows_nonfinite=zero.clone())
    opt_state = optimizer.init(dict(params))
    return TrainState(dict(params), dict(buffers), key, opt_state, states, time)
