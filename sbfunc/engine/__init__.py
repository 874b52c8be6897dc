"""The engine: events, the states, algorithms, combinators, planning and ``run_event``.

Algorithms are pure ``match``/``apply`` pairs: ``match`` decides on the host from the time,
``apply`` returns a new :class:`State` (the one per-step context, focused on the algorithm: its
own state, scratch, decision and key). Combinators build algorithms from algorithms. A
:class:`Planner` orders an algorithm list once per event and decides a step's applications
from ``match``; :func:`apply_planned` applies them to a :class:`Carry`; :func:`run_event` does
both for one event and returns the new :class:`TrainState` with a :class:`Trace` per
application.
"""

from sbfunc._namespace import api_dir
from sbfunc.engine.algorithm import FLAGS, Algorithm, ApplyResult
from sbfunc.engine.combinators import chain, during, every_n_steps, named_chain, on_events, when
from sbfunc.engine.events import Event
from sbfunc.engine.hyperparams import Schedule, inject_hyperparams
from sbfunc.engine.plan import Leaf, Plan, Planned, Planner, flatten
from sbfunc.engine.run import Carry, apply_planned, run_event
from sbfunc.engine.state import State, Time, TrainState
from sbfunc.engine.trace import Trace, stream_ids, trace_labels, unpack_result

__all__ = [
    "FLAGS",
    "Algorithm",
    "ApplyResult",
    "Carry",
    "Event",
    "Leaf",
    "Plan",
    "Planned",
    "Planner",
    "Schedule",
    "State",
    "Time",
    "Trace",
    "TrainState",
    "apply_planned",
    "chain",
    "during",
    "every_n_steps",
    "flatten",
    "inject_hyperparams",
    "named_chain",
    "on_events",
    "run_event",
    "stream_ids",
    "trace_labels",
    "unpack_result",
    "when",
]


__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
