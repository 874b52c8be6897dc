"""Hypothesis strategies for events, algorithms, pytree batches and train states."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st

from sbfunc import random as sbrandom
from sbfunc.engine.algorithm import FLAGS, Algorithm
from sbfunc.engine.events import Event
from sbfunc.engine.state import State, Time
from sbfunc.testing.toy import Toy

__all__ = ["algorithm_lists", "algorithms", "events", "pytree_batches", "states"]

_NAMES = ("A", "B", "C", "SelectiveBackprop", "CutOut")


def events() -> st.SearchStrategy[Event]:
    """Any of the 40 events.

    Example:
        >>> from hypothesis import given, settings
        >>> from sbfunc.engine import Event
        >>> from sbfunc.testing import events
        >>> @settings(max_examples=10, derandomize=True, database=None)
        ... @given(events())
        ... def is_event(event):
        ...     assert isinstance(event, Event)
        >>> is_event()

    References:
        Hypothesis ``sampled_from``.
    """
    return st.sampled_from(list(Event))


@st.composite
def algorithms(draw: st.DrawFn, tag: Any = None) -> Algorithm:
    """A :class:`Toy` with random flags, a random name (collisions are likely) and events.

    Args:
        tag: the toy's tag (default: a drawn int).

    Example:
        >>> from sbfunc.testing import algorithms
        >>> from hypothesis import given, settings
        >>> @settings(max_examples=10, derandomize=True, database=None)
        ... @given(algorithms())
        ... def flags_are_bools(alg):
        ...     assert isinstance(alg.selects_samples, bool)
        >>> flags_are_bools()

    References:
        Hypothesis ``composite`` strategies.
    """
    flags = {f: draw(st.booleans()) for f in FLAGS}
    matched = draw(st.none() | st.frozensets(events(), min_size=1, max_size=6))
    return Toy(
        draw(st.integers(0, 99)) if tag is None else tag,
        events=matched,
        name=draw(st.sampled_from(_NAMES)),
        exit_code=draw(st.none() | st.integers(0, 3)),
        **flags,
    )


@st.composite
def algorithm_lists(draw: st.DrawFn, min_size: int = 0, max_size: int = 8) -> list[Algorithm]:
    """Lists of :func:`algorithms` whose tags are their positions (so logs show the order).

    Args:
        min_size: the shortest list.
        max_size: the longest list.

    Example:
        >>> from sbfunc.testing import algorithm_lists
        >>> from hypothesis import given, settings
        >>> @settings(max_examples=10, derandomize=True, database=None)
        ... @given(algorithm_lists(max_size=4))
        ... def tags_are_positions(algs):
        ...     assert [a.tag for a in algs] == list(range(len(algs)))
        >>> tags_are_positions()

    References:
        Hypothesis ``lists``.
    """
    n = draw(st.integers(min_size, max_size))
    return [draw(algorithms(tag=i)) for i in range(n)]


@st.composite
def pytree_batches(draw: st.DrawFn, max_size: int = 8) -> Any:
    """A batch pytree (tuple, dict or nested, with metadata leaves) of ``N`` rows.

    Values come from an ``sbfunc.random`` key drawn as an integer, so examples are reproducible.

    Args:
        max_size: the largest ``N`` (``N >= 1``).

    Example:
        >>> from sbfunc.testing import pytree_batches
        >>> from hypothesis import given, settings
        >>> @settings(max_examples=10, derandomize=True, database=None)
        ... @given(pytree_batches())
        ... def has_rows(batch):
        ...     assert sbfunc.batch_size(batch) >= 1
        >>> has_rows()

    References:
        optree pytrees; Hypothesis ``composite``.
    """
    n = draw(st.integers(1, max_size))
    kx, ky = sbrandom.split(sbrandom.key(draw(st.integers(0, 2**32))))
    x = sbrandom.uniform(kx, (n, draw(st.integers(1, 4))))
    y = sbrandom.bits(ky, (n,)) % 3
    kind = draw(st.sampled_from(("tuple", "dict", "nested")))
    if kind == "tuple":
        return (x, y)
    if kind == "dict":
        return {"input": x, "target": y}
    return {"input": (x, x * 2), "target": y, "meta": "toy", "scale": torch.tensor(1.0)}


@st.composite
def states(draw: st.DrawFn, with_batch: bool = True) -> State:
    """A :class:`State` with small params/buffers, a random :class:`Time`, key and batch.

    Args:
        with_batch: draw a :func:`pytree_batches` batch (else ``batch=None``).

    Example:
        >>> from sbfunc.testing import states
        >>> from hypothesis import given, settings
        >>> @settings(max_examples=10, derandomize=True, database=None)
        ... @given(states())
        ... def elapsed_in_range(state):
        ...     assert 0.0 <= state.time.elapsed <= 1.0
        >>> elapsed_in_range()

    References:
        optax states; Hypothesis ``composite``.
    """
    key = sbrandom.key(draw(st.integers(0, 2**32)))
    kp = sbrandom.fold_in(key, 1)
    dim = draw(st.integers(1, 3))
    time = Time(
        step=draw(st.integers(0, 1000)),
        epoch=draw(st.integers(0, 10)),
        batch_in_epoch=draw(st.integers(0, 100)),
        elapsed=draw(st.floats(0.0, 1.0, allow_nan=False)),
        samples_forwarded=draw(st.integers(0, 10**6)),
        samples_backpropagated=draw(st.integers(0, 10**6)),
    )
    return State(
        params={"weight": sbrandom.uniform(kp, (dim, dim)), "bias": torch.zeros(dim)},
        buffers={"count": torch.zeros((), dtype=torch.int64)},
        key=key,
        batch=draw(pytree_batches()) if with_batch else None,
        time=time,
    )
