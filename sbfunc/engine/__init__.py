"""The engine: events, the states, algorithms, combinators, planning and ``run_event``.

Algorithms are pure ``match``/``apply`` pairs: ``match`` decides on the host from the time,
``apply`` returns a new :class:`State` (the one per-step context, focused on the algorithm: its
own state, scratch, decision and key). Combinators build algorithms from algorithms.
:func:`run_event` orders an algorithm list for one event, applies the matching ones and
returns the new :class:`TrainState` with a :class:`Trace` per application. (The planning and
applying machinery the step uses lives in ``sbfunc.engine.plan`` and ``sbfunc.engine.run``.)
"""

from sbfunc._namespace import api_dir
from sbfunc.engine.algorithm import Algorithm
from sbfunc.engine.combinators import chain, during, every_n_steps, named_chain, on_events, when
from sbfunc.engine.events import Event
from sbfunc.engine.hyperparams import Schedule, inject_hyperparams
from sbfunc.engine.run import run_event
from sbfunc.engine.state import State, Time, TrainState
from sbfunc.engine.trace import Trace

__all__ = [
    "Algorithm",
    "Event",
    "Schedule",
    "State",
    "Time",
    "Trace",
    "TrainState",
    "chain",
    "during",
    "every_n_steps",
    "inject_hyperparams",
    "named_chain",
    "on_events",
    "run_event",
    "when",
]


__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
