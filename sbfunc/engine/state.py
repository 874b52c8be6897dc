"""The immutable train state: a NamedTuple pytree updated functionally with ``replace``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from sbfunc import random as sbrandom

if TYPE_CHECKING:
    from sbfunc.engine.algorithm import Algorithm

__all__ = ["State", "Time", "init_state", "load_state_dict", "state_dict"]


class Time(NamedTuple):
    """Training progress, as plain Python numbers (reading them never syncs a device).

    Attributes:
        step: optimizer steps done.
        epoch: epochs done.
        batch_in_epoch: index of the current batch inside the epoch.
        elapsed: fraction of training done, in ``[0, 1]``.
        samples_forwarded: samples that went through a forward pass (scoring included).
        samples_backpropagated: samples that the gradient was computed on.

    Example:
        >>> from sbfunc.engine import Time
        >>> Time(step=3, elapsed=0.5)._replace(step=4)
        Time(step=4, epoch=0, batch_in_epoch=0, elapsed=0.5, samples_forwarded=0, samples_backpropagated=0)

    References:
        MosaicML Composer ``composer.core.Timestamp``.
    """  # noqa: E501

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    elapsed: float = 0.0
    samples_forwarded: int = 0
    samples_backpropagated: int = 0


class State(NamedTuple):
    """Everything a training loop carries between events, as one immutable pytree.

    A NamedTuple is an optree pytree node natively, so ``optree.tree_map`` reaches every tensor
    (e.g. to move a state to a device). Never mutate a state or its dicts: build a new one with
    :meth:`replace`. ``key`` comes third and has no default, so no state ever holds a hidden
    seed; use :func:`init_state` to build one.

    Attributes:
        params: trainable tensors by name (``sbfunc.split_module``).
        buffers: non-trainable tensors by name.
        key: an ``sbfunc.random`` key; algorithms split it and store the remainder back.
        opt_state: the optimizer state (e.g. torchopt's).
        batch: the current pytree batch.
        outputs: the model outputs of the current batch.
        loss: the current loss.
        sample_weights: per-sample loss weights of the current batch (set by selection
            policies), or ``None`` for a plain mean.
        time: a :class:`Time`.
        algorithm_state: each algorithm's own state, by algorithm name.

    Example:
        >>> from sbfunc.engine import State
        >>> s = State(params={}, buffers={}, key=sbfunc.random.key(0))
        >>> s.replace(loss=torch.tensor(1.0)).loss
        tensor(1.)
        >>> s.loss is None
        True

    References:
        MosaicML Composer ``composer.core.State``; optax/flax ``TrainState``.
    """

    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    key: torch.Tensor
    opt_state: Any = ()
    batch: Any = None
    outputs: Any = None
    loss: torch.Tensor | None = None
    sample_weights: torch.Tensor | None = None
    time: Time = Time()
    algorithm_state: dict[str, Any] = {}  # noqa: RUF012  (never mutated: replaced)

    def replace(self, **changes: Any) -> State:
        """A new state with ``changes`` applied (this one is unchanged).

        Args:
            **changes: new values by field name.

        Returns:
            The updated copy.

        Raises:
            TypeError: if a name is not a field of ``State`` (the message names it).

        Example:
            >>> from sbfunc.engine import State
            >>> s = State(params={}, buffers={}, key=sbfunc.random.key(0))
            >>> s.replace(batch=torch.ones(2)).batch
            tensor([1., 1.])
            >>> s.replace(lr=0.1)
            Traceback (most recent call last):
            ...
            TypeError: State has no field 'lr'; fields are ...
        """
        try:
            return self._replace(**changes)
        except ValueError:
            unknown = sorted(set(changes) - set(self._fields))
            raise TypeError(
                f"State has no field {unknown[0]!r}; fields are {', '.join(self._fields)}"
            ) from None


def init_state(
    params: Mapping[str, torch.Tensor],
    buffers: Mapping[str, torch.Tensor],
    *,
    key: torch.Tensor,
    opt_state: Any = (),
    algorithms: Iterable[Algorithm] = (),
) -> State:
    """Build a :class:`State` and fill ``algorithm_state`` from each algorithm's ``init``.

    Combined algorithms are walked depth first through their ``parts``, so the state of every
    chained or wrapped algorithm is stored under its own name. Each gets its own key, folded in
    from ``key`` by its position in that walk; ``state.key`` stays ``key``.

    Args:
        params: trainable tensors by name (copied into a new dict).
        buffers: non-trainable tensors by name (copied into a new dict).
        key: an ``sbfunc.random`` key.
        opt_state: the optimizer state.
        algorithms: algorithms whose ``init(key)`` result is stored under their ``name``.

    Returns:
        The initial state (time zero, no batch).

    Raises:
        TypeError: if ``key`` is not an ``sbfunc.random`` key, or an algorithm lacks ``init``.
        ValueError: if two algorithms with state share a name.

    Example:
        >>> model = torch.nn.Linear(2, 1)
        >>> params, buffers = sbfunc.split_module(model)
        >>> from sbfunc.engine import init_state
        >>> state = init_state(params, buffers, key=sbfunc.random.key(0))
        >>> sorted(state.params), state.time.step, state.algorithm_state
        (['bias', 'weight'], 0, {})

    References:
        optax ``GradientTransformation.init``; flax ``TrainState.create``.
    """
    if not sbrandom.is_key(key):
        raise TypeError(f"key must be an sbfunc.random key (0-d int64 CPU tensor), got {key!r}")
    algorithm_state: dict[str, Any] = {}
    for i, alg in enumerate(_walk(algorithms)):
        init = getattr(alg, "init", None)
        if init is None:
            raise TypeError(f"algorithms must hold sbfunc Algorithms, got {alg!r}")
        value = init(sbrandom.fold_in(key, i))
        if value is None:
            continue
        if alg.name in algorithm_state:
            raise ValueError(
                f"algorithm {alg!r} has name {alg.name!r}, already used by another algorithm with "
                "state; give it a unique name (name=...) or combine them with chain()"
            )
        algorithm_state[alg.name] = value
    return State(
        params=dict(params),
        buffers=dict(buffers),
        key=key,
        opt_state=opt_state,
        algorithm_state=algorithm_state,
    )


def _walk(algorithms: Iterable[Algorithm]) -> Iterable[Algorithm]:
    """Every algorithm and, depth first, the ``parts`` it combines."""
    for alg in algorithms:
        yield alg
        yield from _walk(getattr(alg, "parts", ()))


def state_dict(state: State) -> dict[str, Any]:
    """A plain-dict form of a state that ``torch.load(..., weights_only=True)`` accepts.

    ``weights_only`` loading refuses NamedTuple classes, so :class:`State` and :class:`Time`
    become dicts; the other leaves (tensors, numbers, strings, dicts, lists) stay as they are.
    An ``opt_state`` holding other NamedTuples (torchopt's) needs ``sbfunc.checkpoint``.

    Args:
        state: the state to convert.

    Returns:
        ``{field: value}`` with ``time`` as a dict.

    Example:
        >>> import io
        >>> from sbfunc.engine import init_state, load_state_dict, state_dict
        >>> s = init_state({"w": torch.ones(2)}, {}, key=sbfunc.random.key(0))
        >>> buf = io.BytesIO()
        >>> torch.save(state_dict(s), buf)
        >>> _ = buf.seek(0)
        >>> load_state_dict(torch.load(buf, weights_only=True)).params
        {'w': tensor([1., 1.])}

    References:
        PyTorch ``torch.load(weights_only=True)``.
    """
    d = state._asdict()
    d["time"] = state.time._asdict()
    return d


def load_state_dict(d: Mapping[str, Any]) -> State:
    """Rebuild a :class:`State` from :func:`state_dict` output.

    Args:
        d: the dict written by :func:`state_dict`.

    Returns:
        The state.

    Raises:
        TypeError: if ``d`` has a key that is not a ``State`` field, or misses a required one.

    Example:
        >>> from sbfunc.engine import init_state, load_state_dict, state_dict
        >>> s = init_state({}, {}, key=sbfunc.random.key(0))
        >>> load_state_dict(state_dict(s)) == s
        True

    References:
        PyTorch ``Module.load_state_dict`` (naming).
    """
    fields = dict(d)
    if "time" in fields:
        fields["time"] = Time(**fields["time"])
    unknown = sorted(set(fields) - set(State._fields))
    if unknown:
        raise TypeError(
            f"d has key {unknown[0]!r}, not a State field ({', '.join(State._fields)})"
        )
    return State(**fields)
