"""Where an algorithm's writes take effect: the fields of a :class:`~sbfunc.Context` that each
event may change.

An ``apply`` returns a new ``Context``; the engine keeps what it wrote. Some writes would be
lost: a ``loss`` set before the loss exists is overwritten, ``grads`` set after the update
are never read, and outside a training step only the persistent fields are kept. The engine
refuses those writes (:func:`check_writes`) instead of dropping them silently, naming the
event where the write would take effect. The check compares object identities on the host:
it costs nothing on the device and nothing in a compiled graph.
"""

from __future__ import annotations

from collections.abc import Mapping

from sbfunc.engine._events import Event
from sbfunc.engine._state import Context

__all__ = ["EVALUATION", "OUTSIDE_STEP", "Writable", "check_writes", "in_step"]

Writable = Mapping[str, frozenset[Event]]
"""Restricted field -> the events on which a write to it takes effect (fields not named may
be written on any event)."""

_NEVER: frozenset[Event] = frozenset()
_ORDER = list(Event)  # Composer's order
_UP_TO_BACKWARD = frozenset(  # AFTER_DATALOADER ... BEFORE_BACKWARD
    _ORDER[_ORDER.index(Event.AFTER_DATALOADER) : _ORDER.index(Event.BEFORE_BACKWARD) + 1]
)
_LOSS = frozenset({Event.AFTER_LOSS, Event.BEFORE_BACKWARD})
_BATCH_VALUES = (
    "batch",
    "outputs",
    "loss",
    "losses",
    "grads",
    "sample_weights",
    "token_losses",
    "token_weights",
)

_COUNTERS = {"time": _NEVER, "samples_scored": _NEVER, "rows_unscorable": _NEVER, "kept": _NEVER}
OUTSIDE_STEP: Writable = _COUNTERS | {f: _NEVER for f in _BATCH_VALUES}
"""Outside a step (``INIT``, ``EPOCH_END``, ...) only ``params``, ``buffers``,
``opt_state`` and the algorithm's own state are kept."""

EVALUATION: Writable = _COUNTERS | {
    f: _NEVER
    for f in ("loss", "losses", "grads", "sample_weights", "token_losses", "token_weights")
}
"""On the evaluation events the ``batch`` and the ``outputs`` (the metrics) are read too."""


def in_step(*, staged: bool) -> Writable:
    """The writes a training step reads (see docs/how-to/custom-algorithm.md for the table).

    Args:
        staged: whether the loss runs its forward apart from its criterion
            (:class:`~sbfunc.module.ModuleLoss`), so that ``outputs`` changed on ``AFTER_FORWARD``
            or ``BEFORE_LOSS`` reach the criterion.

    Example:
        >>> from sbfunc.engine.internal import in_step
        >>> sorted(e.name for e in in_step(staged=True)["loss"])
        ['AFTER_LOSS', 'BEFORE_BACKWARD']
    """
    outputs = frozenset({Event.AFTER_FORWARD, Event.BEFORE_LOSS}) if staged else _NEVER
    return {
        "time": _NEVER,
        "loss": _LOSS,
        "losses": _LOSS,
        "token_losses": _LOSS,
        "token_weights": _LOSS,
        "sample_weights": _UP_TO_BACKWARD,
        "grads": frozenset({Event.AFTER_BACKWARD}),
        "outputs": outputs,
    }


def check_writes(
    event: Event, before: Context, after: Context, label: str, writable: Writable
) -> None:
    """Raise if ``after`` changed a field that ``event`` may not change.

    Args:
        event: the event being applied.
        before: the state the algorithm was given.
        after: the state it returned.
        label: the algorithm's label, for the message.
        writable: the restricted fields and where they take effect.

    Raises:
        ValueError: naming the algorithm, the field, the event and where the write would
            take effect.

    Example:
        >>> s = sbfunc.Context(sbfunc.random.key(0))
        >>> check_writes(sbfunc.Event.BEFORE_FORWARD, s, s.replace(loss=torch.tensor(1.0)),
        ...              "Mine", in_step(staged=True))
        Traceback (most recent call last):
        ...
        ValueError: Mine changed state.loss on BEFORE_FORWARD, ... on AFTER_LOSS or BEFORE_BACKWARD
    """
    for field, events in writable.items():
        if event not in events and getattr(after, field) is not getattr(before, field):
            raise ValueError(
                f"{label} changed state.{field} on {event.name}, where the step never reads "
                f"the change: {_where(field, events, writable)}"
            )


def _where(field: str, events: frozenset[Event], writable: Writable) -> str:
    """Where a write to ``field`` would take effect, for the message."""
    if field == "time":
        return "the clock is the step's own: algorithms read state.time, never change it"
    if events:
        names = sorted(events, key=_ORDER.index)
        return "it takes effect only on " + " or ".join(e.name for e in names)
    if writable is OUTSIDE_STEP:
        return "outside a training step only params, buffers, opt_state and own are kept"
    if writable is EVALUATION:
        return "evaluation reads only the batch and the outputs (its metrics)"
    return (
        "this step's loss is one function (no forward apart from its criterion), so nothing "
        "reads state.outputs; build it with sbfunc.per_sample_loss(module, criterion)"
    )
