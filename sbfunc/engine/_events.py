"""The 40 training-loop events, in Composer's order and with Composer's values."""

from __future__ import annotations

from enum import Enum

__all__ = ["Event"]


class Event(Enum):
    """A point of the training loop at which algorithms may run.

    The members, their order and their values (the lowercase names) are Composer's, so code and
    logs written against Composer read the same. Iterating the enum yields the events in the
    order one fit visits them (``INIT`` ... ``FIT_END``, then evaluation and prediction).

    Example:
        >>> from sbfunc.engine import Event
        >>> len(Event), Event.AFTER_DATALOADER.value
        (40, 'after_dataloader')
        >>> Event.AFTER_LOSS.is_after_event, Event.AFTER_LOSS.canonical_name
        (True, 'loss')
        >>> Event("before_forward") is Event.BEFORE_FORWARD
        True

    References:
        MosaicML Composer ``composer.core.Event`` (v0.32.1).
    """

    INIT = "init"
    BEFORE_LOAD = "before_load"
    AFTER_LOAD = "after_load"
    FIT_START = "fit_start"
    ITERATION_START = "iteration_start"
    EPOCH_START = "epoch_start"
    BEFORE_DATALOADER = "before_dataloader"
    AFTER_DATALOADER = "after_dataloader"
    BATCH_START = "batch_start"
    BEFORE_TRAIN_BATCH = "before_train_batch"
    BEFORE_FORWARD = "before_forward"
    AFTER_FORWARD = "after_forward"
    BEFORE_LOSS = "before_loss"
    AFTER_LOSS = "after_loss"
    BEFORE_BACKWARD = "before_backward"
    AFTER_BACKWARD = "after_backward"
    AFTER_TRAIN_BATCH = "after_train_batch"
    BATCH_END = "batch_end"
    BATCH_CHECKPOINT = "batch_checkpoint"
    EPOCH_END = "epoch_end"
    EPOCH_CHECKPOINT = "epoch_checkpoint"
    ITERATION_END = "iteration_end"
    ITERATION_CHECKPOINT = "iteration_checkpoint"
    FIT_END = "fit_end"
    EVAL_BEFORE_ALL = "eval_before_all"
    EVAL_START = "eval_start"
    EVAL_BATCH_START = "eval_batch_start"
    EVAL_BEFORE_FORWARD = "eval_before_forward"
    EVAL_AFTER_FORWARD = "eval_after_forward"
    EVAL_BATCH_END = "eval_batch_end"
    EVAL_END = "eval_end"
    EVAL_AFTER_ALL = "eval_after_all"
    EVAL_STANDALONE_START = "eval_standalone_start"
    EVAL_STANDALONE_END = "eval_standalone_end"
    PREDICT_START = "predict_start"
    PREDICT_BATCH_START = "predict_batch_start"
    PREDICT_BEFORE_FORWARD = "predict_before_forward"
    PREDICT_AFTER_FORWARD = "predict_after_forward"
    PREDICT_BATCH_END = "predict_batch_end"
    PREDICT_END = "predict_end"

    # Enum's own hash (``hash(self._name_)``), not a faster ``__hash__ = object.__hash__`` here:
    # torch 2.11's dynamo refuses to hash an object whose class defines ``__hash__``, and the
    # compiled step looks events up in dicts (measured: 10 hashes per step on the host, each
    # dict lookup 1.6x the identity hash's, 0.1-0.4 us more; 50 more in an eager step's core).

    @property
    def is_before_event(self) -> bool:
        """Whether the event opens a pair: ``BEFORE_*``, ``*_BEFORE_*`` or ``*_START``.

        ``INIT`` and the ``*_CHECKPOINT`` events are neither before nor after events.

        Example:
            >>> from sbfunc.engine import Event
            >>> Event.BEFORE_LOSS.is_before_event, Event.EPOCH_START.is_before_event
            (True, True)
            >>> Event.INIT.is_before_event, Event.AFTER_LOSS.is_before_event
            (False, False)
        """
        return self in _BEFORE_EVENTS

    @property
    def is_after_event(self) -> bool:
        """Whether the event closes a pair: ``AFTER_*``, ``*_AFTER_*`` or ``*_END``.

        Only the events whose *value starts with* ``after_`` get their algorithm order
        reversed by ``sbfunc.engine.set_filo_order`` (as in Composer); ``*_END`` events do not.

        Example:
            >>> from sbfunc.engine import Event
            >>> Event.AFTER_DATALOADER.is_after_event, Event.BATCH_END.is_after_event
            (True, True)
            >>> Event.BATCH_CHECKPOINT.is_after_event
            False
        """
        return self in _AFTER_EVENTS

    @property
    def canonical_name(self) -> str:
        """The value without its ``before_``/``after_`` prefix and ``_start``/``_end`` suffix.

        A before/after (or start/end) pair shares one canonical name.

        Example:
            >>> from sbfunc.engine import Event
            >>> Event.BEFORE_TRAIN_BATCH.canonical_name, Event.EPOCH_END.canonical_name
            ('train_batch', 'epoch')
        """
        name = self.value
        name = name.replace("before_", "").replace("after_", "")
        return name.replace("_start", "").replace("_end", "")

    @property
    def is_eval(self) -> bool:
        """Whether the event belongs to evaluation (its value starts with ``eval_``).

        Example:
            >>> from sbfunc.engine import Event
            >>> Event.EVAL_BATCH_END.is_eval, Event.BATCH_END.is_eval
            (True, False)
        """
        return self.value.startswith("eval_")

    @property
    def is_predict(self) -> bool:
        """Whether the event belongs to prediction (its value starts with ``predict_``).

        Example:
            >>> from sbfunc.engine import Event
            >>> Event.PREDICT_END.is_predict, Event.FIT_END.is_predict
            (True, False)
        """
        return self.value.startswith("predict_")


def _opens(event: Event) -> bool:
    v = event.value
    return v.startswith("before_") or "_before_" in v or v.endswith("_start")


def _closes(event: Event) -> bool:
    v = event.value
    return v.startswith("after_") or "_after_" in v or v.endswith("_end")


_BEFORE_EVENTS = frozenset(e for e in Event if _opens(e))
_AFTER_EVENTS = frozenset(e for e in Event if _closes(e))
