"""The process group as the data-parallel code sees it: rank, world size, the collectives it
uses, and a meter of the bytes they move.

Every collective is torch's own (``all_reduce``, ``all_gather_single``, ``all_to_all_single``,
``broadcast``), runs eagerly and under ``torch.compile``, and mutates none of its inputs.
Without an initialised default process group a :class:`Comm` is a world of one (rank 0): every
collective returns its input's value and moves nothing, so the same code runs in one plain
process. How the collectives compile: ``docs/how-to/distributed.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from sbfunc._tracing import tracing
from sbfunc.distributed._meter import TrafficMeter

__all__ = ["DEFAULT_BUCKET_BYTES", "Comm", "buckets", "nbytes"]

DEFAULT_BUCKET_BYTES = 25 * 2**20
"""The gradient bucket size, as DDP's ``bucket_cap_mb=25``."""


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def buckets(tensors: Sequence[torch.Tensor], bucket_bytes: int) -> list[list[int]]:
    """Indices of ``tensors`` grouped by (dtype, device) in order of first appearance, each
    group cut into buckets of at most ``bucket_bytes`` (a larger tensor is a bucket alone)."""
    groups: dict[tuple[torch.dtype, torch.device], list[list[int]]] = {}
    sizes: dict[tuple[torch.dtype, torch.device], int] = {}
    for i, t in enumerate(tensors):
        k = (t.dtype, t.device)
        size = nbytes(t)
        if k not in groups or sizes[k] + size > bucket_bytes:
            groups.setdefault(k, []).append([])
            sizes[k] = 0
        groups[k][-1].append(i)
        sizes[k] += size
    return [b for bs in groups.values() for b in bs if b]


def _flat(tensors: Sequence[torch.Tensor], idx: list[int]) -> torch.Tensor:
    return torch.cat([tensors[i].reshape(-1) for i in idx])


def _unflat(
    flats: Sequence[torch.Tensor], groups: list[list[int]], like: Sequence[torch.Tensor]
) -> list[torch.Tensor]:
    """The tensors shaped like ``like`` that the bucket buffers ``flats`` hold."""
    out: list[Any] = [None] * len(like)
    for flat, idx in zip(flats, groups, strict=True):
        parts = torch.split(flat, [like[i].numel() for i in idx])
        for p, i in zip(parts, idx, strict=True):
            out[i] = p.view(like[i].shape)
    return out


class Comm:
    """One process group: its rank and size and the collectives of :mod:`sbfunc.distributed`.

    Args:
        group: a ``torch.distributed`` process group; ``None`` for the default group (or, when
            no default group is initialised, a world of one).
        meter: a :class:`TrafficMeter` that records every eager collective, or ``None``.

    Raises:
        ValueError: if ``group`` is given while ``torch.distributed`` is not initialised.

    Example:
        >>> from sbfunc.distributed import Comm
        >>> comm = Comm()  # no process group in this doctest: a world of one
        >>> comm.rank, comm.world
        (0, 1)
        >>> comm.all_reduce_sum([torch.ones(2)], scale=3)
        [tensor([3., 3.])]

    References:
        PyTorch ``torch.distributed`` and ``torch.distributed._functional_collectives``; DDP's
        gradient buckets (Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating
        Data Parallel Training").
    """

    def __init__(self, group: Any = None, *, meter: TrafficMeter | None = None) -> None:
        if meter is not None and not isinstance(meter, TrafficMeter):
            raise TypeError(f"meter must be an sbfunc.distributed.TrafficMeter, got {meter!r}")
        self.meter = meter
        self.device: torch.device | None = None
        if dist.is_available() and dist.is_initialized():
            self.group = dist.group.WORLD if group is None else group
            self.rank = dist.get_rank(self.group)
            self.world = dist.get_world_size(self.group)
            if self.rank < 0:
                raise ValueError("this process is not a member of group")
            self.device = _wire_device(dist.get_backend(self.group))
        elif group is not None:
            raise ValueError(
                "group was given but torch.distributed is not initialised; call "
                "torch.distributed.init_process_group first (torchrun sets its environment)"
            )
        else:
            self.group, self.rank, self.world = None, 0, 1

    def __repr__(self) -> str:
        return f"Comm(rank={self.rank}, world={self.world})"

    def _record(self, purpose: str, payload: int, received: int) -> None:
        if self.meter is not None and not tracing():
            self.meter.record(purpose, payload=payload, received=received)

    def _wire(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` on the device the backend communicates from (NCCL: the current GPU; gloo:
        the CPU), contiguous."""
        return (t if self.device is None else t.to(self.device)).contiguous()

    def all_reduce_sum(
        self,
        tensors: Sequence[torch.Tensor],
        *,
        scale: float | int = 1,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        purpose: str = "gradients",
    ) -> list[torch.Tensor]:
        """``sum over ranks of scale * t`` for every tensor, in buckets of ``bucket_bytes``
        (one flat buffer per bucket, every bucket's collective in flight at once).

        Every rank must pass tensors of the same shapes, dtypes and order.
        """
        groups = buckets(tensors, bucket_bytes)
        flats = [_flat(tensors, b) * scale for b in groups]
        if self.world > 1:
            wire = [self._wire(f) for f in flats]
            if tracing():
                wire = [_fc().all_reduce(f, "sum", self.group) for f in wire]
            else:
                works = [dist.all_reduce(f, group=self.group, async_op=True) for f in wire]
                for w in works:
                    w.wait()
            for f in wire:
                self._record(purpose, nbytes(f), 2 * (self.world - 1) * nbytes(f) // self.world)
            flats = [w.to(f.device) for w, f in zip(wire, flats, strict=True)]
        return _unflat(flats, groups, tensors)

    def broadcast(
        self,
        tensors: Sequence[torch.Tensor],
        *,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        purpose: str = "broadcast",
    ) -> list[torch.Tensor]:
        """Rank 0's value of every tensor, on every rank (bucketed like
        :meth:`all_reduce_sum`)."""
        groups = buckets(tensors, bucket_bytes)
        flats = [_flat(tensors, b).clone() for b in groups]
        if self.world > 1:
            wire = [self._wire(f) for f in flats]
            if tracing():  # rank 0's block of an all-gather: exact, and group-rank based
                wire = [_fc().all_gather_tensor(f, 0, self.group)[: f.numel()] for f in wire]
            else:
                for f in wire:
                    dist.broadcast(f, group=self.group, group_src=0)
            for f in wire:
                self._record(purpose, nbytes(f), 0 if self.rank == 0 else nbytes(f))
            flats = [w.to(f.device) for w, f in zip(wire, flats, strict=True)]
        return _unflat(flats, groups, tensors)

    def all_gather(self, tensor: torch.Tensor, *, purpose: str = "gather") -> torch.Tensor:
        """Every rank's ``tensor`` concatenated along dim 0 in rank order; every rank must
        pass the same shape."""
        if self.world == 1:
            return tensor.clone()
        wire = self._wire(tensor)
        if tracing():
            out = _fc().all_gather_tensor(wire, 0, self.group)
        else:
            out = wire.new_empty((self.world * wire.shape[0], *wire.shape[1:]))
            gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            gather(out, wire, group=self.group)
        self._record(purpose, nbytes(wire), (self.world - 1) * nbytes(wire))
        return out.to(tensor.device)

    def all_to_all(
        self,
        tensor: torch.Tensor,
        send: Sequence[int],
        receive: Sequence[int],
        *,
        purpose: str = "rebalance",
    ) -> torch.Tensor:
        """Rows ``tensor[sum(send[:d]) : sum(send[:d+1])]`` go to rank ``d``; the result holds
        the rows received from every rank, in rank order (``receive[s]`` from rank ``s``)."""
        if self.world == 1:
            return tensor.clone()
        send, receive = [int(s) for s in send], [int(r) for r in receive]
        wire = self._wire(tensor)
        if tracing():
            out = _fc().all_to_all_single(wire, receive, send, self.group)
        else:
            out = wire.new_empty((sum(receive), *wire.shape[1:]))
            dist.all_to_all_single(out, wire, receive, send, group=self.group)
        row = nbytes(wire[:1]) if wire.shape[0] else nbytes(out[:1])
        self._record(purpose, nbytes(wire), (sum(receive) - receive[self.rank]) * row)
        return out.to(tensor.device)


def _wire_device(backend: str) -> torch.device | None:
    """Where tensors must be for ``backend``: NCCL the current GPU, gloo the CPU (always
    supported), any other the tensor's own device."""
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu") if backend == "gloo" else None


def _fc() -> Any:
    """The traceable functional collectives module (imported on first use)."""
    import torch.distributed._functional_collectives as funcol

    return funcol
