"""sbfunc: selective backprop and composable training-loop algorithms as pure functions.

The data flow is score -> select -> prune -> step. Every stage is a pure function of explicit
inputs (parameters, buffers, a pytree batch, a random key). The top level holds the spine: the
loss (:func:`per_sample_loss`), the step (:func:`make_train_step`, :class:`TrainState`,
:func:`fit`), :class:`SelectiveBackprop`, :class:`Algorithm` with its events and combinators,
and the sub-packages, from the bottom of the stack up: :mod:`sbfunc.random` (keys),
:mod:`sbfunc.batch` (pytree batches), :mod:`sbfunc.module` (the per-sample loss),
:mod:`sbfunc.optim` (gradient transformations and schedules), :mod:`sbfunc.score` and
:mod:`sbfunc.select` (scores, selections), :mod:`sbfunc.policies` (selection rules),
:mod:`sbfunc.engine` (events, algorithms, ordering), :mod:`sbfunc.selective_backprop`,
:mod:`sbfunc.algorithms` (Composer's suite), :mod:`sbfunc.per_sample` (per-sample gradients on a
subset), :mod:`sbfunc.checkpoint`, :mod:`sbfunc.step`, :mod:`sbfunc.distributed`, and the
leaves: :mod:`sbfunc.compat`, :mod:`sbfunc.datasets`, :mod:`sbfunc.models`,
:mod:`sbfunc.testing`.
"""

from sbfunc import (
    algorithms,
    checkpoint,
    compat,
    datasets,
    engine,
    models,
    optim,
    per_sample,
    policies,
    random,
    score,
    select,
    selective_backprop,
    step,
)
from sbfunc.engine import (
    Algorithm,
    Context,
    Event,
    Time,
    TrainState,
    during,
    every_n_steps,
    named_sequence,
    on_events,
    schedule_hyperparams,
    sequence,
    when,
)
from sbfunc.module import per_sample_loss, predict, split_module
from sbfunc.selective_backprop import SelectiveBackprop
from sbfunc.step import fit, make_train_step

__version__ = "1.1.0"

__all__ = [
    "Algorithm",
    "Context",
    "Event",
    "SelectiveBackprop",
    "Time",
    "TrainState",
    "algorithms",
    "checkpoint",
    "compat",
    "datasets",
    "during",
    "engine",
    "every_n_steps",
    "fit",
    "make_train_step",
    "models",
    "named_sequence",
    "on_events",
    "optim",
    "per_sample",
    "per_sample_loss",
    "policies",
    "predict",
    "random",
    "schedule_hyperparams",
    "score",
    "select",
    "selective_backprop",
    "sequence",
    "split_module",
    "step",
    "when",
]


# The documented modules outside __all__, listed by dir() once imported (sbfunc.testing needs
# hypothesis, sbfunc.distributed is imported on demand)
_NAMESPACES = frozenset({"batch", "distributed", "module", "testing", "types", "validation"})


def __dir__() -> list[str]:  # dir(sbfunc): the API and the imported documented submodules
    return sorted({*__all__, "__version__", *(n for n in _NAMESPACES if n in globals())})
