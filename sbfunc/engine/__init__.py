"""The engine: events, the states, algorithms, combinators, planning and ``run_event``.

Algorithms are pure ``match``/``apply`` pairs: ``match`` decides on the host from the time,
``apply`` returns a new :class:`Context` (the one per-step context, focused on the algorithm: its
own state, scratch, decision and key). Combinators build algorithms from algorithms.
:func:`run_event` orders an algorithm list for one event, applies the matching ones and
returns the new :class:`TrainState` with a :class:`Trace` per application. (The planning and
applying machinery the step uses lives in ``sbfunc.engine.plan`` and ``sbfunc.engine.run``.)
"""

from sbfunc._namespace import api_dir, deprecated_aliases
from sbfunc.engine.algorithm import Algorithm
from sbfunc.engine.combinators import (
    during,
    every_n_steps,
    named_sequence,
    on_events,
    sequence,
    when,
)
from sbfunc.engine.events import Event
from sbfunc.engine.hyperparams import ElapsedSchedule, schedule_hyperparams
from sbfunc.engine.run import run_event
from sbfunc.engine.state import Context, Time, TrainState
from sbfunc.engine.trace import Trace

__all__ = [
    "Algorithm",
    "Context",
    "ElapsedSchedule",
    "Event",
    "Time",
    "Trace",
    "TrainState",
    "during",
    "every_n_steps",
    "named_sequence",
    "on_events",
    "run_event",
    "schedule_hyperparams",
    "sequence",
    "when",
]


__getattr__ = deprecated_aliases(
    "sbfunc.engine",
    {
        "State": "sbfunc.engine:Context",
        "Schedule": "sbfunc.engine:ElapsedSchedule",
        "chain": "sbfunc.engine:sequence",
        "named_chain": "sbfunc.engine:named_sequence",
        "inject_hyperparams": "sbfunc.engine:schedule_hyperparams",
    },
)
__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
