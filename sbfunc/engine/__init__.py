"""The engine: events, the two states, algorithms, combinators and ``run_event``.

Algorithms are pure ``match``/``apply`` pairs: ``match`` decides on the host, ``apply`` returns
a new :class:`State` focused on the algorithm (its own state, scratch and key). Combinators
build algorithms from algorithms; :func:`plan_event` decides an event and
:func:`apply_planned` applies it (the training step splits the two); :func:`run_event` does
both for one event and returns the new :class:`TrainState` with a :class:`Trace` per
application.
"""

from sbfunc.engine.algorithm import FLAGS, Algorithm, ApplyResult
from sbfunc.engine.combinators import chain, during, every_n_steps, named_chain, on_events, when
from sbfunc.engine.events import Event
from sbfunc.engine.hyperparams import Schedule, inject_hyperparams
from sbfunc.engine.run import (
    Planned,
    Run,
    Trace,
    apply_planned,
    plan_event,
    run_event,
    stream_ids,
    trace_labels,
    unpack_result,
)
from sbfunc.engine.state import Clock, State, Time, TrainState

__all__ = [
    "FLAGS",
    "Algorithm",
    "ApplyResult",
    "Clock",
    "Event",
    "Planned",
    "Run",
    "Schedule",
    "State",
    "Time",
    "Trace",
    "TrainState",
    "apply_planned",
    "chain",
    "during",
    "every_n_steps",
    "inject_hyperparams",
    "named_chain",
    "on_events",
    "plan_event",
    "run_event",
    "stream_ids",
    "trace_labels",
    "unpack_result",
    "when",
]
