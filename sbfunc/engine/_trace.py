"""Traces and identities: how the engine names and labels each algorithm it applies."""

from __future__ import annotations

import operator
import zlib
from collections.abc import Sequence
from typing import NamedTuple

from sbfunc.engine._algorithm import Algorithm
from sbfunc.engine._events import Event
from sbfunc.engine._state import Context

__all__ = ["Trace", "stream_ids", "trace_labels", "unpack_result"]


class Trace(NamedTuple):
    """The record of one algorithm applied on one event.

    Attributes:
        name: the algorithm's name, made unique within its list (repeats become ``name#1``,
            ``name#2``, ... by position in the list).
        event: the event.
        order: the position in the applied order (0 first).
        exit_code: what ``apply`` returned beside the state, or ``None``.

    Example:
        >>> from sbfunc.engine import Event, Trace
        >>> Trace("CutOut", Event.AFTER_DATALOADER, 0, None).order
        0

    References:
        MosaicML Composer ``composer.core.engine.Trace``.
    """

    name: str
    event: Event
    order: int
    exit_code: int | None = None


def stream_ids(names: Sequence[str]) -> tuple[int, ...]:
    """The random-stream id of each algorithm from the list of their names: a hash of the name
    and the rank among the algorithms of that name, so adding, removing or moving another
    algorithm never changes an algorithm's draws.

    Example:
        >>> a, b, c = sbfunc.engine.internal.stream_ids(["Toy", "x", "Toy"])
        >>> a != c, sbfunc.engine.internal.stream_ids(["x"])[0] == b
        (True, True)

    References:
        JAX ``jax.random.fold_in`` (deriving independent streams from stable identifiers).
    """
    seen: dict[str, int] = {}
    out = []
    for name in names:
        rank = seen.get(name, 0)
        seen[name] = rank + 1
        out.append(zlib.crc32(name.encode()) | (rank << 32))
    return tuple(out)


def trace_labels(algorithms: Sequence[Algorithm]) -> tuple[str, ...]:
    """Each algorithm's label in traces: its name, repeats suffixed ``#1``, ``#2``, ...

    Example:
        >>> from sbfunc.testing import Toy
        >>> sbfunc.engine.trace_labels([Toy(), Toy(name="B"), Toy()])
        ('Toy', 'B', 'Toy#1')
    """
    seen: dict[str, int] = {}
    taken: set[str] = set()
    out = []
    for name in map(operator.attrgetter("name"), algorithms):
        label, k = name, seen.get(name, 0)
        while label in taken:
            k += 1
            label = f"{name}#{k}"
        seen[name] = k
        taken.add(label)
        out.append(label)
    return tuple(out)


def unpack_result(result: object, alg: Algorithm) -> tuple[Context, int | None]:
    """``(state, exit_code)`` from what an ``apply`` returned (raises ``TypeError`` otherwise)."""
    if isinstance(result, Context):
        return result, None
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], Context):
        return result[0], result[1]
    raise TypeError(
        f"{alg.name}.apply must return a Context or a (Context, exit_code) pair, "
        f"got {type(result).__name__}"
    )
