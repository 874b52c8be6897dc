"""The states of a run, by lifetime, and its one clock.

* :class:`TrainState` persists from step to step (and into checkpoints): parameters, buffers,
  the optimizer state, one state per algorithm (a tuple that mirrors the algorithm list), the
  root key and the clock. ``step.init(params, buffers, key=...)`` builds it; nothing else does.
* :class:`Context` is what an algorithm sees on one event (``State`` in 0.3; Composer's
  ``State`` is the whole trainer, :class:`TrainState` here): the persistent fields, the current
  batch's values (``batch``, ``outputs``, ``loss``, ``losses``, ``grads``, ``sample_weights``),
  which live for one step only, and the fields focused on the algorithm
  being applied: ``own`` (its entry of ``TrainState.algorithm_state``), ``scratch`` (its
  per-batch entry, ``None`` at the start of every step), ``matched`` (what its ``match``
  returned) and ``key`` (its own random key for this step and event). The engine carries one
  ``Context`` through a whole step and re-focuses it on each algorithm it applies.

:class:`Time` is the one clock. ``match`` reads it as Python numbers (deciding on the host never
syncs a device, and the engine decides outside the compiled step); inside ``apply`` the same
record holds 0-d tensors (:meth:`Time.as_tensors`), because a Python number read there would
be baked into a compiled graph and recompile it every step.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

import torch

from sbfunc._tracing import replace_by_constructor
from sbfunc.select import Selection
from sbfunc.types import Params
from sbfunc.validation import check_int

__all__ = ["Clock", "Context", "Duration", "Time", "TrainState"]


@replace_by_constructor
class Time(NamedTuple):
    """Training progress: the one clock of a run.

    On the host (``state.time`` of a :class:`TrainState`, and what ``match`` sees) the fields
    are Python numbers; inside ``apply`` they are 0-d tensors (:meth:`as_tensors`).

    Attributes:
        step: loader batches consumed by steps (optimizer updates plus skipped updates).
        epoch: epochs done.
        batch_in_epoch: index of the current batch inside the epoch.
        elapsed: fraction of training done, in ``[0, 1]``: ``step / total_steps`` once the
            run's length is known, advanced by every step.
        samples_forwarded: rows that went through a forward pass (scoring passes included).
        samples_backpropagated: rows the gradient was computed on.
        updates_skipped: a 0-d ``int64`` tensor (on the device, so counting never syncs):
            steps whose update did not reach the parameters (a non-finite loss or gradient, or
            no rows left to train on). ``None`` only in a hand-made ``Time``.
        total_steps: the run's length in steps (``step.init(..., total_steps=N)``, or set by
            :func:`sbfunc.fit`); ``None`` while unknown. Algorithms that decide from
            ``elapsed`` (``uses_elapsed``) refuse to run without it.
        rows_nonfinite: a 0-d ``int64`` tensor: training rows left out of updates because
            their input or loss was not finite, selection's unscorable rows included
            (``Context.rows_unscorable``; ``None`` only in a hand-made ``Time``).

    Example:
        >>> sbfunc.Time(step=3, total_steps=6)._replace(step=4).step
        4
        >>> sbfunc.Time(step=7, elapsed=0.25).as_tensors().step
        tensor(7)

    References:
        MosaicML Composer ``composer.core.Timestamp``; JAX: a traced step reads its counters
        from arrays, never from Python numbers.
    """

    step: Any = 0
    epoch: Any = 0
    batch_in_epoch: Any = 0
    elapsed: Any = 0.0
    samples_forwarded: Any = 0
    samples_backpropagated: Any = 0
    updates_skipped: torch.Tensor | None = None
    total_steps: Any = None
    rows_nonfinite: torch.Tensor | None = None

    def as_tensors(self, device: torch.device | str | None = None) -> Time:
        """This time with every number as a 0-d tensor on ``device`` (``int64``, ``elapsed``
        ``float32``; ``total_steps`` stays ``None`` when unknown): what ``apply`` reads. Two
        small host-to-device copies."""
        ints = torch.tensor(
            [
                self.step,
                self.epoch,
                self.batch_in_epoch,
                self.samples_forwarded,
                self.samples_backpropagated,
                -1 if self.total_steps is None else self.total_steps,
            ],
            dtype=torch.int64,
            device=device,
        ).unbind()
        skipped, bad = self.updates_skipped, self.rows_nonfinite
        if skipped is None or bad is None:  # a hand-made Time: count from zero
            zero = ints[0].new_zeros(())
            skipped, bad = (zero if v is None else v for v in (skipped, bad))
        return Time(
            ints[0],
            ints[1],
            ints[2],
            torch.tensor(self.elapsed, dtype=torch.float32, device=device),
            ints[3],
            ints[4],
            skipped,
            None if self.total_steps is None else ints[5],
            bad,
        )

    def advanced(self, *, forwarded: int, backpropagated: int) -> Time:
        """The host time after one step that forwarded and backpropagated these rows."""
        step = self.step + 1
        total = self.total_steps
        return self._replace(
            step=step,
            batch_in_epoch=self.batch_in_epoch + 1,
            elapsed=self.elapsed if total is None else min(step / total, 1.0),
            samples_forwarded=self.samples_forwarded + forwarded,
            samples_backpropagated=self.samples_backpropagated + backpropagated,
        )


class Clock(NamedTuple):
    """A step's start :class:`Time` packed into one ``int64`` tensor: one
    host-to-device copy a step, where :meth:`Time.as_tensors` makes two, and one input of the
    compiled core instead of eight. :meth:`time` unpacks it, inside the core, into the same
    0-d tensors :meth:`Time.as_tensors` makes (bit for bit: ``elapsed`` travels as its
    float64 bits and is rounded to float32 as ``torch.tensor(elapsed, dtype=float32)`` does).

    Attributes:
        values: ``int64 Tensor[7]``: ``step``, ``epoch``, ``batch_in_epoch``,
            ``samples_forwarded``, ``samples_backpropagated``, ``total_steps`` (``-1`` while
            unknown) and the float64 bits of ``elapsed``.
        total_known: whether ``total_steps`` is known (a host value: the core's structure).

    Example:
        >>> from sbfunc.engine.internal import Clock
        >>> t = sbfunc.Time(step=7, elapsed=0.1, total_steps=70)
        >>> Clock.of(t, "cpu").time(t) == t.as_tensors()
        True
    """

    values: torch.Tensor
    total_known: bool

    @staticmethod
    def of(time: Time, device: torch.device | str | None) -> Clock:
        """``time``'s host numbers packed on ``device``."""
        known = time.total_steps is not None
        bits = struct.unpack("<q", struct.pack("<d", float(time.elapsed)))[0]
        total = time.total_steps if known else -1
        counts = (time.step, time.epoch, time.batch_in_epoch, time.samples_forwarded,
                  time.samples_backpropagated, total, bits)  # fmt: skip
        return Clock(torch.tensor(counts, dtype=torch.int64, device=device), known)

    def time(self, host: Time) -> Time:
        """The :class:`~sbfunc.Time` of 0-d tensors ``apply`` reads, with ``host``'s device
        counters (``updates_skipped``, ``rows_nonfinite``; zeros where ``None``)."""
        v = self.values.unbind()
        zero = v[0].new_zeros(())
        skipped, bad = host.updates_skipped, host.rows_nonfinite
        return Time(
            v[0],
            v[1],
            v[2],
            v[6].view(torch.float64).to(torch.float32),
            v[3],
            v[4],
            zero if skipped is None else skipped,
            v[5] if self.total_known else None,
            zero if bad is None else bad,
        )


@replace_by_constructor
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


@replace_by_constructor
class Context(NamedTuple):
    """What one algorithm sees when it is applied on one event.

    An ``apply(event, ctx)`` reads these fields and returns ``ctx.replace(...)``; the engine
    writes ``params``, ``buffers``, ``opt_state``, the batch's values and ``own``/``scratch``
    back into the run. ``key`` is the algorithm's own key for this step and event: draw from
    it (split it for several draws) and never store it.

    Attributes:
        key: this algorithm's key for this step and event (``None`` for algorithms that
            declare ``uses_key = False``).
        params: trainable tensors by name.
        buffers: non-trainable tensors by name.
        opt_state: the optimizer state.
        time: the :class:`Time`: Python numbers in ``match``, 0-d tensors in ``apply``.
        own: this algorithm's persistent state (its ``init(key)`` value, as last returned).
        scratch: this algorithm's per-batch state; ``None`` at the start of every step.
        matched: what this algorithm's ``match`` returned for this event (combinators return
            their parts' decisions and read them back here).
        batch: the current batch (any pytree).
        outputs: the model outputs of the current batch (``AFTER_FORWARD`` on).
        loss: the training loss, a 0-d tensor (``AFTER_LOSS`` on). On ``AFTER_LOSS`` and
            ``BEFORE_BACKWARD`` it still carries its autograd history, and a new value set
            there is what is backpropagated.
        losses: the per-sample training losses of the rows of ``batch`` (``AFTER_LOSS`` on;
            differentiable on ``AFTER_LOSS``/``BEFORE_BACKWARD``, detached after: new values
            set there are averaged and backpropagated).
        grads: the gradients of ``loss`` by parameter name (``AFTER_BACKWARD``; an algorithm
            that changes them there changes the update).
        sample_weights: per-sample loss weights set by selection policies, or ``None``
            (a change takes effect up to ``BEFORE_BACKWARD``).
        token_losses: for a loss over tokens (:class:`sbfunc.module.TokenLosses`) under the
            step's ``"tokens"`` objective, the ``[N, T...]`` token losses (``AFTER_LOSS`` and
            ``BEFORE_BACKWARD``, differentiable); ``None`` otherwise.
        token_weights: their ``[N, T...]`` weights in the objective: 1 for a real token, 0
            for padding; an algorithm that sets new ones on ``AFTER_LOSS`` or
            ``BEFORE_BACKWARD`` (a token selection) changes what is backpropagated, the mean
            of the token losses under them.
        samples_scored: rows forwarded by scoring passes during this step.
        rows_unscorable: rows a selection left out during this step that could not be
            scored (a non-finite score or input), a 0-d ``int64`` tensor on the device;
            ``None`` while no selection ran. The step adds it to ``rows_nonfinite``
            (:class:`sbfunc.step.StepMetrics`, :class:`Time`).
        kept: the rows a selection kept, a :class:`~sbfunc.select.Selection` of indices into
            the batch it selected from (the step's batch, unless an algorithm before it pruned
            that) and the kept rows' loss weights (or ``None``); ``None`` while no selection
            ran. The step reports it as ``StepMetrics.kept``.

    Which event may change which field: :mod:`sbfunc.engine`.

    Example:
        >>> s = sbfunc.Context(sbfunc.random.key(0), batch=(torch.zeros(2, 3),))
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
    own: Any = ()
    scratch: Any = None
    matched: Any = True
    batch: Any = None
    outputs: Any = None
    loss: torch.Tensor | None = None
    losses: torch.Tensor | None = None
    grads: Params | None = None
    sample_weights: torch.Tensor | None = None
    token_losses: torch.Tensor | None = None
    token_weights: torch.Tensor | None = None
    samples_scored: int = 0
    rows_unscorable: torch.Tensor | None = None
    kept: Selection | None = None

    def replace(self, **changes: Any) -> Context:
        """A new state with ``changes`` applied; raises ``TypeError`` naming an unknown field.

        Example:
            >>> s = sbfunc.Context(sbfunc.random.key(0))
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


class Duration(NamedTuple):
    """Training length in epochs or in steps (exactly one of them).

    Example:
        >>> sbfunc.engine.Duration(epochs=3).total_steps(steps_per_epoch=10)
        30

    References:
        MosaicML Composer ``Time`` and ``TimeUnit`` (durations in epochs or batches).
    """

    epochs: int | None = None
    steps: int | None = None

    def total_steps(self, steps_per_epoch: int) -> int:
        """Total optimizer steps for ``steps_per_epoch`` batches per epoch."""
        if (self.epochs is None) == (self.steps is None):
            raise ValueError(
                "give exactly one of epochs or steps, "
                f"got epochs={self.epochs}, steps={self.steps}"
            )
        which = "epochs" if self.epochs is not None else "steps"
        value = check_int(self.epochs if self.epochs is not None else self.steps, which, low=1)
        return self.steps if self.steps is not None else value * steps_per_epoch
