"""The two states of a run, by lifetime: what persists between steps and what one event sees.

* :class:`TrainState` persists from step to step (and into checkpoints): parameters, buffers,
  the optimizer state, one state per algorithm (a tuple that mirrors the algorithm list), the
  root key and the clock. ``step.init(params, buffers, key=...)`` builds it; nothing else does.
* :class:`State` is what one algorithm sees when it is applied on one event (Composer's
  ``State``): the persistent fields, the current batch's values (``batch``, ``outputs``,
  ``loss``, ``losses``, ``sample_weights``), which live for one step only, and three fields
  focused on that algorithm: ``own`` (its entry of ``TrainState.algorithm_state``),
  ``scratch`` (its per-batch entry, ``None`` at the start of every step) and ``key`` (its own
  random key for this step and event).

Time comes in two forms. :class:`Time` holds the host clock as plain Python numbers (what
``match`` decides from: reading it never syncs a device, and the engine decides outside the
compiled step). :class:`Clock` carries the same clock as 0-d tensors for code that runs inside
the step (``apply``): a Python number read there would be baked into a compiled graph and
recompile it every step.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

__all__ = ["Clock", "State", "Time", "TrainState"]

Params = dict[str, torch.Tensor]


class Time(NamedTuple):
    """Training progress on the host.

    Attributes:
        step: loader batches consumed by steps (optimizer updates plus skipped updates).
        epoch: epochs done.
        batch_in_epoch: index of the current batch inside the epoch.
        elapsed: fraction of training done, in ``[0, 1]`` (set by :func:`sbfunc.fit`).
        samples_forwarded: rows that went through a forward pass (scoring passes included).
        samples_backpropagated: rows the gradient was computed on.
        updates_skipped: a 0-d ``int64`` tensor (on the device, so counting never syncs):
            steps whose update did not reach the parameters (a non-finite loss or gradient, or
            no rows left to train on). ``None`` only in a hand-made ``Time``.

    Example:
        >>> sbfunc.Time(step=3, elapsed=0.5)._replace(step=4).step
        4

    References:
        MosaicML Composer ``composer.core.Timestamp``.
    """

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    elapsed: float = 0.0
    samples_forwarded: int = 0
    samples_backpropagated: int = 0
    updates_skipped: torch.Tensor | None = None


class Clock(NamedTuple):
    """The host clock as 0-d tensors, for tensor code inside the step.

    Attributes:
        step: ``int64``, :attr:`Time.step`.
        epoch: ``int64``, :attr:`Time.epoch`.
        elapsed: ``float32``, :attr:`Time.elapsed`.

    Example:
        >>> clock = sbfunc.Clock.of(sbfunc.Time(step=7, elapsed=0.25))
        >>> clock.step, clock.elapsed
        (tensor(7), tensor(0.2500))

    References:
        JAX: a traced step reads its counters from arrays, never from Python numbers.
    """

    step: torch.Tensor
    epoch: torch.Tensor
    elapsed: torch.Tensor

    @staticmethod
    def of(time: Time, device: torch.device | str | None = None) -> Clock:
        """The clock of ``time`` on ``device`` (three small host-to-device copies)."""
        return Clock(
            torch.tensor(time.step, dtype=torch.int64, device=device),
            torch.tensor(time.epoch, dtype=torch.int64, device=device),
            torch.tensor(time.elapsed, dtype=torch.float32, device=device),
        )


class TrainState(NamedTuple):
    """Everything that persists from one training step to the next, as one immutable pytree.

    Build it with ``step.init(params, buffers, key=key)`` (see :func:`sbfunc.make_train_step`),
    which also initialises the optimizer and every algorithm. A NamedTuple is an optree node, so
    ``optree.tree_map`` reaches every tensor (to move a state to a device) and
    :mod:`sbfunc.checkpoint` saves and loads it against a freshly initialised template.

    Attributes:
        params: trainable tensors by name (:func:`sbfunc.split_module`).
        buffers: non-trainable tensors by name.
        key: the root :mod:`sbfunc.random` key. It never changes: every random draw of a run is
            derived from it, the clock and the drawing algorithm's place in the list.
        opt_state: the optimizer state (:mod:`sbfunc.optim`).
        algorithm_state: one entry per algorithm, in the order of the algorithm list (a
            combinator's entry holds its parts' states the same way).
        time: the :class:`Time`.

    Example:
        >>> s = sbfunc.TrainState({"w": torch.ones(2)}, {}, sbfunc.random.key(0))
        >>> s.replace(params={"w": torch.zeros(2)}).params["w"], s.params["w"]
        (tensor([0., 0.]), tensor([1., 1.]))

    References:
        flax ``TrainState``; optax (state that mirrors the structure of the transforms).
    """

    params: Params
    buffers: Params
    key: torch.Tensor
    opt_state: Any = ()
    algorithm_state: tuple[Any, ...] = ()
    time: Time = Time()

    def replace(self, **changes: Any) -> TrainState:
        """A new state with ``changes`` applied; raises ``TypeError`` naming an unknown field.

        Example:
            >>> s = sbfunc.TrainState({}, {}, sbfunc.random.key(0))
            >>> s.replace(lr=0.1)
            Traceback (most recent call last):
            ...
            TypeError: TrainState has no field 'lr'; fields are params, buffers, key, ...
        """
        return _replace(self, changes)


class State(NamedTuple):
    """What one algorithm sees when it is applied on one event.

    An ``apply(event, state)`` reads these fields and returns ``state.replace(...)``; the engine
    writes ``params``, ``buffers``, ``opt_state``, the batch's values and ``own``/``scratch``
    back into the run. ``key`` is the algorithm's own key for this step and event: draw from
    it (split it for several draws) and never store it.

    Attributes:
        key: this algorithm's key for this step and event (``None`` for algorithms that
            declare ``uses_key = False``).
        params: trainable tensors by name.
        buffers: non-trainable tensors by name.
        opt_state: the optimizer state.
        time: the host :class:`Time` (for ``match``; inside ``apply`` read :attr:`clock`).
        clock: the clock as tensors (``None`` outside a step when nothing needs it).
        own: this algorithm's persistent state (its ``init(key)`` value, as last returned).
        scratch: this algorithm's per-batch state; ``None`` at the start of every step.
        matched: what this algorithm's ``match`` returned for this event (combinators return
            their parts' decisions and read them back here).
        batch: the current batch (any pytree).
        outputs: the model outputs of the current batch (``AFTER_FORWARD`` on).
        loss: the training loss, a 0-d tensor (``AFTER_LOSS`` on).
        losses: the per-sample training losses of the rows of ``batch``, detached
            (``AFTER_LOSS`` on).
        grads: the gradients of ``loss`` by parameter name (``AFTER_BACKWARD``; an algorithm
            that changes them there changes the update).
        sample_weights: per-sample loss weights set by selection policies, or ``None``.
        samples_scored: rows forwarded by scoring passes during this step.

    Example:
        >>> s = sbfunc.State(sbfunc.random.key(0), batch=(torch.zeros(2, 3),))
        >>> s.replace(loss=torch.tensor(1.0)).loss
        tensor(1.)

    References:
        MosaicML Composer ``composer.core.State``.
    """

    key: torch.Tensor  # None only for an algorithm that declares uses_key = False
    params: Params = {}  # noqa: RUF012  (never mutated: replaced)
    buffers: Params = {}  # noqa: RUF012
    opt_state: Any = ()
    time: Time = Time()
    clock: Clock | None = None
    own: Any = ()
    scratch: Any = None
    matched: Any = True
    batch: Any = None
    outputs: Any = None
    loss: torch.Tensor | None = None
    losses: torch.Tensor | None = None
    grads: Params | None = None
    sample_weights: torch.Tensor | None = None
    samples_scored: int = 0

    def replace(self, **changes: Any) -> State:
        """A new state with ``changes`` applied; raises ``TypeError`` naming an unknown field.

        Example:
            >>> s = sbfunc.State(sbfunc.random.key(0))
            >>> s.replace(batch=torch.ones(2)).batch
            tensor([1., 1.])
        """
        return _replace(self, changes)


def _replace(obj: Any, changes: dict[str, Any]) -> Any:
    try:
        return obj._replace(**changes)
    except ValueError:
        unknown = sorted(set(changes) - set(obj._fields))
        raise TypeError(
            f"{type(obj).__name__} has no field {unknown[0]!r}; fields are "
            f"{', '.join(obj._fields)}"
        ) from None
