"""Hypothesis strategies for events, algorithms, pytree batches and train states."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st

from sbfunc import random as sbrandom
from sbfunc.engine import FLAGS, Algorithm, Context, Event, Time, TrainState
from sbfunc.testing._toy import Toy
from sbfunc.validation import check_int

__all__ = [
    "CLASSES",
    "FEATURES",
    "algorithm_lists",
    "algorithms",
    "events",
    "linear_loss",
    "pytree_batches",
    "states",
    "train_states",
]

CLASSES = 3
"""The number of classes of the toy batches and the linear classifier."""

FEATURES = 2
"""The default number of features of :func:`pytree_batches` and :func:`train_states`, so that
the two fit together (:func:`linear_loss`) without arguments."""

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
def pytree_batches(draw: st.DrawFn, max_size: int = 8, features: int | None = FEATURES) -> Any:
    """A batch pytree (tuple, dict or nested, with metadata leaves) of ``N`` rows.

    Every form holds ``x`` (``[N, features]`` floats) and ``y`` (``[N]`` class indices in
    ``[0, 3)``) where :func:`linear_loss` finds them. Values come from an ``sbfunc.random``
    key drawn as an integer, so examples are reproducible. The default ``features`` is
    :data:`FEATURES`, the default of :func:`train_states` too, so a drawn state and a drawn
    batch fit together (:func:`states` draws both with one feature count).

    Args:
        max_size: the largest ``N`` (``N >= 1``).
        features: the number of features (:data:`FEATURES` by default; drawn in ``[1, 4]``
            when ``None``).

    Raises:
        ValueError: if ``max_size`` or ``features`` is below 1.

    Example:
        >>> from sbfunc.testing import pytree_batches
        >>> from hypothesis import given, settings
        >>> @settings(max_examples=10, derandomize=True, database=None)
        ... @given(pytree_batches())
        ... def has_rows(batch):
        ...     assert sbfunc.batch.batch_size(batch) >= 1
        >>> has_rows()

    References:
        optree pytrees; Hypothesis ``composite``.
    """
    n = draw(st.integers(1, check_int(max_size, "max_size", low=1)))
    d = draw(_feature_counts(features))
    kx, ky = sbrandom.split(sbrandom.key(draw(st.integers(0, 2**32))))
    x = sbrandom.uniform(kx, (n, d))
    y = sbrandom.randint(ky, (n,), 0, CLASSES)
    kind = draw(st.sampled_from(("tuple", "dict", "nested")))
    if kind == "tuple":
        return (x, y)
    if kind == "dict":
        return {"input": x, "target": y}
    return {"input": (x, x * 2), "target": y, "meta": "toy", "scale": torch.tensor(1.0)}


def _feature_counts(features: int | None) -> st.SearchStrategy[int]:
    """``features`` (checked), or any count in ``[1, 4]`` for ``None``."""
    if features is None:
        return st.integers(1, 4)
    return st.just(check_int(features, "features", low=1, fix="or None (drawn in [1, 4])"))


def _features(batch: Any) -> torch.Tensor:
    if isinstance(batch, tuple):
        return batch[0]
    x = batch["input"]
    return x[0] if isinstance(x, tuple) else x


def _targets(batch: Any) -> torch.Tensor:
    return batch[1] if isinstance(batch, tuple) else batch["target"]


def linear_loss(params: dict[str, torch.Tensor], buffers: Any, batch: Any) -> torch.Tensor:
    """The per-sample cross-entropy of the linear classifier of :func:`states` on any
    :func:`pytree_batches` batch: a :class:`sbfunc.types.LossFn` for property tests.

    Example:
        >>> from sbfunc.testing import linear_loss
        >>> params = {"weight": torch.zeros(3, 2), "bias": torch.zeros(3)}
        >>> linear_loss(params, {}, (torch.ones(4, 2), torch.tensor([0, 1, 2, 0]))).shape
        torch.Size([4])

    References:
        PyTorch ``torch.nn.functional.linear`` and ``cross_entropy``.
    """
    logits = torch.nn.functional.linear(_features(batch), params["weight"], params["bias"])
    return torch.nn.functional.cross_entropy(logits, _targets(batch), reduction="none")


def _time(draw: st.DrawFn) -> Time:
    return Time(
        step=draw(st.integers(0, 1000)),
        epoch=draw(st.integers(0, 10)),
        batch_in_epoch=draw(st.integers(0, 100)),
        elapsed=draw(st.floats(0.0, 1.0, allow_nan=False)),
        samples_forwarded=draw(st.integers(0, 10**6)),
        samples_backpropagated=draw(st.integers(0, 10**6)),
        updates_skipped=torch.tensor(draw(st.integers(0, 10))),
    )


@st.composite
def states(draw: st.DrawFn, with_batch: bool = True, features: int | None = None) -> Context:
    """A :class:`~sbfunc.Context` (what ``apply`` sees) whose params and batch fit together.

    The params are a linear classifier (``weight [3, d]``, ``bias [3]``) and the batch a
    :func:`pytree_batches` batch with ``d`` features, so :func:`linear_loss` (or an algorithm
    that runs it, such as Selective Backprop) works on every example; time and key are drawn.

    Args:
        with_batch: draw a batch (else ``batch=None``).
        features: ``d`` (drawn in ``[1, 4]`` when ``None``, the default).

    Raises:
        ValueError: if ``features`` is below 1.

    Example:
        >>> from sbfunc.testing import linear_loss, states
        >>> from hypothesis import given, settings
        >>> @settings(max_examples=10, derandomize=True, database=None)
        ... @given(states())
        ... def loss_runs(state):
        ...     losses = linear_loss(state.params, state.buffers, state.batch)
        ...     assert losses.shape == (sbfunc.batch.batch_size(state.batch),)
        >>> loss_runs()

    References:
        optax states; Hypothesis ``composite``.
    """
    key = sbrandom.key(draw(st.integers(0, 2**32)))
    d = draw(_feature_counts(features))
    params = {
        "weight": sbrandom.normal(sbrandom.fold_in(key, 1), (CLASSES, d)),
        "bias": torch.zeros(CLASSES),
    }
    return Context(
        key,
        params=params,
        buffers={},
        time=_time(draw),
        batch=draw(pytree_batches(features=d)) if with_batch else None,
    )


@st.composite
def train_states(
    draw: st.DrawFn, num_algorithms: int = 0, features: int | None = FEATURES
) -> TrainState:
    """A :class:`~sbfunc.TrainState` with the params of :func:`states`, a drawn time and key,
    and ``num_algorithms`` empty algorithm states (``()``, what :class:`Toy` starts from).

    Its linear classifier takes ``features`` inputs, :data:`FEATURES` by default as for
    :func:`pytree_batches`: the defaults of the two fit together.

    Args:
        num_algorithms: how many empty algorithm states.
        features: the classifier's inputs (drawn in ``[1, 4]`` when ``None``).

    Raises:
        ValueError: if ``num_algorithms`` is negative or ``features`` below 1.

    Example:
        >>> from sbfunc.testing import linear_loss, pytree_batches, train_states
        >>> from hypothesis import given, settings
        >>> @settings(max_examples=5, derandomize=True, database=None)
        ... @given(train_states(num_algorithms=2), pytree_batches())
        ... def fits(state, batch):
        ...     assert state.algorithm_state == ((), ())
        ...     assert linear_loss(state.params, state.buffers, batch).ndim == 1
        >>> fits()

    References:
        flax ``TrainState``; Hypothesis ``composite``.
    """
    count = check_int(num_algorithms, "num_algorithms", low=0)
    view = draw(states(with_batch=False, features=features))
    return TrainState(
        view.params,
        view.buffers,
        view.key,
        algorithm_state=((),) * count,
        time=view.time,
    )
