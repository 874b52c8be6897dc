"""Counting the bytes that collectives move: :class:`Traffic` and :class:`TrafficMeter`."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Traffic", "TrafficMeter"]


class Traffic(NamedTuple):
    """Bytes moved by one kind of collective traffic, as seen from one rank.

    Attributes:
        calls: collectives launched.
        payload: bytes this rank handed to them (its input tensors).
        received: bytes this rank received: for an all-reduce of ``S`` bytes over ``W`` ranks
            ``2 (W - 1) / W * S`` (a bandwidth-optimal ring), for an all-gather of ``s`` bytes
            per rank ``(W - 1) * s``, for an all-to-all the rows other ranks sent, for a
            broadcast ``S`` on every rank but the source.

    Example:
        >>> from sbfunc.distributed import Traffic
        >>> Traffic(1, 400, 400)._replace(calls=2).calls
        2

    References:
        Patarasuk and Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters of
        workstations"; Thakur, Rabenseifner and Gropp 2005, "Optimization of Collective
        Communication Operations in MPICH".
    """

    calls: int = 0
    payload: int = 0
    received: int = 0


class TrafficMeter:
    """A host-side tally of the collectives' bytes by purpose (``"gradients"``, ``"scores"``,
    ``"rebalance"``, ...), for measuring; pass it to the functions that communicate.

    It records eager calls only: a compiled graph replays its collectives without running
    Python, so measure with an eager step (the byte counts do not depend on compilation).

    Example:
        >>> from sbfunc.distributed import TrafficMeter
        >>> meter = TrafficMeter()
        >>> meter.record("scores", payload=64, received=64)
        >>> meter.totals()
        {'scores': Traffic(calls=1, payload=64, received=64)}
    """

    def __init__(self) -> None:
        self._totals: dict[str, Traffic] = {}

    def record(self, purpose: str, *, payload: int, received: int) -> None:
        """Add one collective of ``purpose``."""
        t = self._totals.get(purpose, Traffic())
        self._totals[purpose] = Traffic(t.calls + 1, t.payload + payload, t.received + received)

    def totals(self) -> dict[str, Traffic]:
        """A copy of the tallies by purpose."""
        return dict(self._totals)

    def reset(self) -> None:
        """Forget every tally."""
        self._totals.clear()
