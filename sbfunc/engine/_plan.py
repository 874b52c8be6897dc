"""Deciding which algorithms run: their order once, when a step is built; ``match`` per step.

An algorithm list is flattened into *leaves*: every algorithm, with ``sequence``/``named_sequence``
expanded into their parts (so ``sequence(a, b)`` runs exactly like ``[a, b]``), each with the path
of its state inside ``TrainState.algorithm_state`` (which still mirrors the sequences). A
:class:`Planner` runs the ordering passes **once per event, when it is built**, on every leaf
that can match that event. Each step then calls ``match`` once per leaf and event it listens to
(``Algorithm.events``; every event when ``None``), on the host, from the time alone, and keeps
the precomputed order of the leaves that matched. Plans are cached by their decisions, so a
step whose decisions did not change reuses the plan object (and a compiled step its graph).

Passes therefore order algorithms by what they *are* (their flags and places in the list),
not by which of them matched: ordering the whole list and keeping the matched ones equals
ordering the matched ones for every shipped pass (property-tested in
``tests/engine/test_ordering.py``).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, NamedTuple

from sbfunc.engine._algorithm import Algorithm
from sbfunc.engine._combinators import SequenceAlgorithm
from sbfunc.engine._events import Event
from sbfunc.engine._ordering import Pass
from sbfunc.engine._state import Context, Time
from sbfunc.engine._trace import stream_ids, trace_labels

__all__ = ["Leaf", "Plan", "Planned", "Planner", "flatten", "get_path", "set_path"]

Planned = tuple[tuple[int, Any], ...]
"""One event's plan: ``(leaf index, match decision)`` pairs in application order."""

StatePath = tuple[Any, ...]
"""Where an algorithm's state sits in ``TrainState.algorithm_state``: the position in the list,
then the part index or name at each level of sequences."""


class Leaf(NamedTuple):
    """One algorithm the engine applies on its own (sequences are expanded into their parts).

    Attributes:
        algorithm: the algorithm.
        path: where its state sits in ``TrainState.algorithm_state``: the position in the
            list, then the part index (``sequence``) or name (``named_sequence``) at each level.
        label: its name in traces (``sequence/part`` for a part of a sequence).
        streams: the random-stream ids along ``path`` (its key: the step key folded with the
            first and the event, then with each of the others).
    """

    algorithm: Algorithm
    path: StatePath
    label: str
    streams: tuple[int, ...]


def flatten(algorithms: Sequence[Algorithm]) -> tuple[Leaf, ...]:
    """The leaves of an algorithm list, sequences expanded in place, in list order.

    Example:
        >>> from sbfunc.testing import Toy
        >>> leaves = flatten([Toy(), sbfunc.sequence(Toy(name="a"), Toy(name="b"))])
        >>> [(leaf.label, leaf.path) for leaf in leaves]
        [('Toy', (0,)), ('sequence/a', (1, 0)), ('sequence/b', (1, 1))]
    """
    out: list[Leaf] = []
    labels = trace_labels(algorithms)
    streams = stream_ids([a.name for a in algorithms])

    def visit(alg: Algorithm, path: StatePath, label: str, ids: tuple[int, ...]) -> None:
        if not isinstance(alg, SequenceAlgorithm):
            out.append(Leaf(alg, path, label, ids))
            return
        names = alg.names if alg.names is not None else range(len(alg.parts))
        part_labels = trace_labels(alg.parts) if alg.names is None else alg.names
        for where, part, part_label, stream in zip(
            names, alg.parts, part_labels, alg.streams, strict=True
        ):
            visit(part, (*path, where), f"{label}/{part_label}", (*ids, stream))

    for i, (alg, label, stream) in enumerate(zip(algorithms, labels, streams, strict=True)):
        visit(alg, (i,), label, (stream,))
    return tuple(out)


def get_path(states: Any, path: StatePath) -> Any:
    """The entry of ``states`` (nested tuples/dicts, ``None`` for "all unset") at ``path``."""
    for where in path:
        if states is None:
            return None
        states = states[where]
    return states


def set_path(states: Any, path: StatePath, value: Any) -> Any:
    """A copy of ``states`` with the entry at ``path`` replaced (never mutates ``states``)."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(states, dict):
        return {**states, head: set_path(states[head], rest, value)}
    items = list(states)
    items[head] = set_path(items[head], rest, value)
    return tuple(items)


class Plan(NamedTuple):
    """One step's applications: per event, the planned ``(leaf, decision)`` pairs."""

    events: tuple[Planned, ...]

    def __bool__(self) -> bool:
        return any(self.events)


_AFTER_UPDATE = frozenset({Event.AFTER_TRAIN_BATCH, Event.BATCH_END})


class Planner:
    """The ordering of an algorithm list on a tuple of events, decided once (see the module).

    Args:
        algorithms: the algorithms, in list order.
        passes: the ordering passes, run once per event on the leaves that can match it.
        events: the events this schedule plans (the step's per-batch events, or one event).

    Raises:
        ValueError: if a pass returns an algorithm that is not one of those it was given, or
            returns one twice (passes only reorder).
    """

    def __init__(
        self, algorithms: Sequence[Algorithm], passes: Sequence[Pass], events: Sequence[Event]
    ) -> None:
        self.leaves = flatten(algorithms)
        self.events = tuple(events)
        self._index = {e: i for i, e in enumerate(self.events)}
        # per leaf: the (event position, event) pairs it listens to
        self.listens: tuple[tuple[tuple[int, Event], ...], ...] = tuple(
            tuple(
                (i, e)
                for i, e in enumerate(self.events)
                if leaf.algorithm.events is None or e in leaf.algorithm.events
            )
            for leaf in self.leaves
        )
        self.rank = tuple(self._order(e, passes) for e in self.events)
        self._cache: dict[Any, Plan] = {}
        self.empty = Plan(((),) * len(self.events))
        """The plan of a step where nothing matched."""

    def _order(self, event: Event, passes: Sequence[Pass]) -> dict[int, int]:
        """Leaf index -> rank in the application order of ``event``."""
        candidates = [
            i
            for i, leaf in enumerate(self.leaves)
            if leaf.algorithm.events is None or event in leaf.algorithm.events
        ]
        if not candidates:  # nothing can match: the passes are not consulted
            return {}
        # Passes see objects; an object listed twice gets a shallow copy per extra occurrence,
        # so every leaf is a distinct object a pass can move on its own.
        seen: set[int] = set()
        objects: list[Algorithm] = []
        for i in candidates:
            alg = self.leaves[i].algorithm
            objects.append(copy.copy(alg) if id(alg) in seen else alg)
            seen.add(id(alg))
        position = {id(a): i for a, i in zip(objects, candidates, strict=True)}
        ordered: list[Algorithm] = objects
        for p in passes:
            ordered = p(ordered, event)
        rank: dict[int, int] = {}
        for r, alg in enumerate(ordered):
            i = position.pop(id(alg), -1)
            if i < 0:
                raise ValueError(
                    f"a pass returned {alg!r} on {event.name}, which is not one of the "
                    "algorithms it was given, or returned it twice (passes may only reorder)"
                )
            rank[i] = r
        if position:
            missing = [self.leaves[i].label for i in position.values()]
            raise ValueError(
                f"the passes dropped {missing} on {event.name} (they may only reorder)"
            )
        return rank

    def decide(self, time: Time, algorithm_state: Any, after: Time | None = None) -> Plan:
        """Call ``match`` once per leaf and listened event (host only) and return the plan.

        Args:
            time: the time the events see.
            algorithm_state: ``TrainState.algorithm_state`` (each leaf's ``match`` sees its
                own entry).
            after: the time ``AFTER_TRAIN_BATCH`` and ``BATCH_END`` see (the update is done);
                ``None``: ``time``.
        """
        found: list[tuple[int, int, Any]] = []
        for i, (leaf, listens) in enumerate(zip(self.leaves, self.listens, strict=True)):
            if not listens:
                continue
            own = get_path(algorithm_state, leaf.path)
            view = Context(None, time=time, own=own)  # type: ignore[arg-type]
            later = view if after is None else view._replace(time=after)
            for e, event in listens:
                decision = leaf.algorithm.match(event, later if event in _AFTER_UPDATE else view)
                if decision:
                    found.append((e, i, decision))
        key = tuple(found)
        try:
            return self._cache[key]
        except KeyError:
            plan = self._build(found)
            if len(self._cache) < 256:
                self._cache[key] = plan
            return plan
        except TypeError:  # an unhashable decision: plan it without the cache
            return self._build(found)

    def decide_event(self, event: Event, time: Time, algorithm_state: Any) -> Planned:
        """Call ``match`` for ``event`` only, once per leaf that listens to it, and return its
        planned applications (for events outside the step, one at a time)."""
        e = self._index[event]
        rank = self.rank[e]
        found: list[tuple[int, Any]] = []
        for i in rank:  # the leaves that listen to the event
            leaf = self.leaves[i]
            view = Context(None, time=time, own=get_path(algorithm_state, leaf.path))  # type: ignore[arg-type]
            decision = leaf.algorithm.match(event, view)
            if decision:
                found.append((i, decision))
        found.sort(key=lambda p: rank[p[0]])
        return tuple(found)

    def _build(self, found: list[tuple[int, int, Any]]) -> Plan:
        per_event: list[list[tuple[int, Any]]] = [[] for _ in self.events]
        for e, i, decision in found:
            per_event[e].append((i, decision))
        return Plan(
            tuple(
                tuple(sorted(pairs, key=lambda p, r=rank: r[p[0]]))  # type: ignore[misc]
                for pairs, rank in zip(per_event, self.rank, strict=True)
            )
        )

    def planned(self, plan: Plan, event: Event) -> Planned:
        """The planned applications of ``event`` in ``plan``."""
        return plan.events[self._index[event]]
