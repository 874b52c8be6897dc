"""The engine's machinery that builds a training step: no stability guarantee.

These are the parts :mod:`sbfunc.step` and :mod:`sbfunc.distributed` build a step from, for
code that builds a step of its own: :class:`Planner` decides on the host which algorithms run on
each event (a :class:`Plan` per step), :class:`Carry` is what the step threads through its
events, :func:`apply_planned` applies one event's planned algorithms, :func:`advance_time`
moves the clock and :class:`Clock` packs a step's start time into one tensor,
:func:`step_key` and :func:`stream_ids` derive the keys, and :func:`in_step` says which fields
of the context a write may change inside a step.

Unlike the names of :mod:`sbfunc.engine`, these may change in any release, without a
deprecation (as ``equinox.internal``): import them from here, never from :mod:`sbfunc.engine`
(whose old spellings warn until 1.3).
"""

from sbfunc._namespace import api_dir
from sbfunc.engine._plan import Plan, Planner
from sbfunc.engine._run import Carry, advance_time, apply_planned, step_key
from sbfunc.engine._state import Clock
from sbfunc.engine._trace import stream_ids
from sbfunc.engine._writes import in_step

__all__ = [
    "Carry",
    "Clock",
    "Plan",
    "Planner",
    "advance_time",
    "apply_planned",
    "in_step",
    "step_key",
    "stream_ids",
]

__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
