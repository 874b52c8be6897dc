"""``Toy``: a configurable do-nothing algorithm that logs its applications in its own state."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sbfunc.engine import Algorithm, ApplyResult, Context, Event, Trace, trace_labels

__all__ = ["Toy", "applied"]


def applied(traces: Iterable[Trace], algorithms: Sequence[Algorithm]) -> list[int]:
    """The positions in ``algorithms`` of the traced applications, in application order.

    Example:
        >>> from sbfunc.engine import Event, TrainState, run_event
        >>> from sbfunc.testing import Toy, applied
        >>> algs = [Toy(), Toy(), Toy(name="other")]
        >>> state = TrainState({}, {}, sbfunc.random.key(0), algorithm_state=((), (), ()))
        >>> applied(run_event(Event.AFTER_LOSS, state, algs)[1], algs)  # FILO: reversed
        [2, 1, 0]

    References:
        MosaicML Composer ``Trace`` (the engine's record of applications).
    """
    labels = trace_labels(algorithms)
    return [labels.index(t.name) for t in traces]


class Toy(Algorithm):
    """A pure test algorithm: matches chosen events and appends ``tag`` to its own state.

    Its state starts as ``()``; each application appends its ``tag``, so ``state.own`` counts
    its applications. :func:`applied` reads the order of applications across algorithms from
    the engine's traces.

    Args:
        tag: what ``apply`` appends to the log (e.g. the position in a list).
        events: the events it matches (``None``: every event).
        name: its name (default ``"Toy"``).
        exit_code: the exit code ``apply`` reports (``None``: returns a bare state).
        backwards_create_graph: the declared flag, for this instance.
        find_unused_parameters: the declared flag, for this instance.
        interpolate_loss: the declared flag, for this instance.
        selects_samples: the declared flag, for this instance.
        selects_tokens: the declared flag, for this instance.
        fuses_layernorm: the declared flag, for this instance.
        changes_sequence_length: the declared flag, for this instance.

    Raises:
        TypeError: if an event is not an ``Event``.

    Example:
        >>> from sbfunc.engine import Event
        >>> from sbfunc.testing import Toy
        >>> toy = Toy(tag=7, events=[Event.BATCH_END])
        >>> ctx = sbfunc.Context(sbfunc.random.key(0), own=toy.init(sbfunc.random.key(0)))
        >>> toy.match(Event.INIT, ctx), toy.apply(Event.BATCH_END, ctx).own
        (False, (7,))

    References:
        Hypothesis, "stateful and property-based testing"; MosaicML Composer test algorithms.
    """

    def __init__(
        self,
        tag: Any = 0,
        *,
        events: Iterable[Event] | None = None,
        name: str | None = None,
        exit_code: int | None = None,
        backwards_create_graph: bool = False,
        find_unused_parameters: bool = False,
        interpolate_loss: bool = False,
        selects_samples: bool = False,
        selects_tokens: bool = False,
        fuses_layernorm: bool = False,
        changes_sequence_length: bool = False,
    ) -> None:
        self.tag = tag
        self.events = None if events is None else frozenset(events)
        if self.events is not None and not all(isinstance(e, Event) for e in self.events):
            raise TypeError(f"events must hold sbfunc Events, got {events!r}")
        if name is not None:
            self.name = name
        self.exit_code = exit_code
        self.backwards_create_graph = backwards_create_graph
        self.find_unused_parameters = find_unused_parameters
        self.interpolate_loss = interpolate_loss
        self.selects_samples = selects_samples
        self.selects_tokens = selects_tokens
        self.fuses_layernorm = fuses_layernorm
        self.changes_sequence_length = changes_sequence_length

    def init(self, key: Any) -> tuple[Any, ...]:
        return ()

    def match(self, event: Event, ctx: Context) -> bool:
        return self.events is None or event in self.events

    def apply(self, event: Event, ctx: Context) -> ApplyResult:
        ctx = ctx.replace(own=(*(ctx.own or ()), self.tag))
        return ctx if self.exit_code is None else (ctx, self.exit_code)

    def __repr__(self) -> str:
        flags = [
            f
            for f in (
                "selects_samples",
                "selects_tokens",
                "fuses_layernorm",
                "interpolate_loss",
                "changes_sequence_length",
            )
            if getattr(self, f)
        ]
        return f"Toy(tag={self.tag!r}, name={self.name!r}{''.join(', ' + f for f in flags)})"
