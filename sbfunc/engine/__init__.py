"""The engine: events, the train state, algorithms, combinators and ``run_event``.

Algorithms are pure ``match``/``apply`` pairs over an immutable :class:`State`; combinators
build algorithms from algorithms; :func:`run_event` matches, orders (``sbfunc.passes``) and
applies them on one event and returns the new state with a :class:`Trace` per application.
"""

from sbfunc.engine.algorithm import FLAGS, Algorithm, ApplyResult
from sbfunc.engine.combinators import (
    chain,
    during,
    every_n_steps,
    named_chain,
    on_events,
    unique_names,
    when,
)
from sbfunc.engine.events import Event
from sbfunc.engine.hyperparams import Schedule, inject_hyperparams
from sbfunc.engine.run import Trace, run_event
from sbfunc.engine.state import State, Time, init_state, load_state_dict, state_dict

__all__ = [
    "FLAGS",
    "Algorithm",
    "ApplyResult",
    "Event",
    "Schedule",
    "State",
    "Time",
    "Trace",
    "chain",
    "during",
    "every_n_steps",
    "init_state",
    "inject_hyperparams",
    "load_state_dict",
    "named_chain",
    "on_events",
    "run_event",
    "state_dict",
    "unique_names",
    "when",
]
