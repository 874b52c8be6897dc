"""The engine: events, the states, algorithms, combinators, their ordering and ``run_event``.

Algorithms are pure ``match``/``apply`` pairs: ``match`` decides on the host from the time,
``apply`` returns a new :class:`Context` (the one per-step context, focused on the algorithm: its
own state, scratch, decision and key). Combinators build algorithms from algorithms; ordering
passes (:data:`DEFAULT_PASSES`, :func:`register_pass`, Composer's :data:`COMPOSER_PASSES`)
order the algorithms of one event. :func:`run_event` orders an algorithm list for one event,
applies the matching ones and returns the new :class:`TrainState` with a :class:`Trace` per
application.

The machinery a training step is built from (the planner, the carry, the key derivation) has
an internal face of its own, :mod:`sbfunc.engine.internal`, without a stability guarantee.
"""

from sbfunc._namespace import api_dir, moved_names
from sbfunc.engine._algorithm import FLAGS, Algorithm, ApplyResult
from sbfunc.engine._combinators import (
    during,
    every_n_steps,
    named_sequence,
    on_events,
    sequence,
    when,
)
from sbfunc.engine._events import Event
from sbfunc.engine._hyperparams import ElapsedSchedule, schedule_hyperparams
from sbfunc.engine._ordering import (
    COMPOSER_PASSES,
    DEFAULT_PASSES,
    MultipleLossInterpolationWarning,
    Pass,
    order_by_phase,
    phase,
    register_pass,
    set_filo_order,
    sort_fused_layernorm_last,
    sort_selective_backprop_first,
    sort_to_back,
    sort_to_front,
    warn_if_multiple_loss_interpolation,
)
from sbfunc.engine._run import run_event
from sbfunc.engine._state import Context, Duration, Time, TrainState
from sbfunc.engine._trace import Trace, trace_labels, unpack_result
from sbfunc.engine._writes import EVALUATION, Writable

__all__ = [
    "COMPOSER_PASSES",
    "DEFAULT_PASSES",
    "EVALUATION",
    "FLAGS",
    "Algorithm",
    "ApplyResult",
    "Context",
    "Duration",
    "ElapsedSchedule",
    "Event",
    "MultipleLossInterpolationWarning",
    "Pass",
    "Time",
    "Trace",
    "TrainState",
    "Writable",
    "during",
    "every_n_steps",
    "named_sequence",
    "on_events",
    "order_by_phase",
    "phase",
    "register_pass",
    "run_event",
    "schedule_hyperparams",
    "sequence",
    "set_filo_order",
    "sort_fused_layernorm_last",
    "sort_selective_backprop_first",
    "sort_to_back",
    "sort_to_front",
    "trace_labels",
    "unpack_result",
    "warn_if_multiple_loss_interpolation",
    "when",
]

_INTERNAL = ("Carry", "Plan", "Planner", "advance_time", "apply_planned", "in_step")
__getattr__ = moved_names(  # the step's machinery has its own face since 1.2
    "sbfunc.engine", ("1.2", ("sbfunc.engine.internal", (*_INTERNAL, "step_key", "stream_ids")))
)
__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
