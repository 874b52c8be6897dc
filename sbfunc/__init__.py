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
:mod:`sbfunc.testing`. The sub-packages the step never uses (Composer's suite, per-sample
curvature, the compat layer, the datasets, the models) load on first use.
"""

from typing import TYPE_CHECKING

from sbfunc import (
    checkpoint,
    engine,
    optim,
    policies,
    random,
    score,
    select,
    selective_backprop,
    step,
)
from sbfunc._namespace import Namespace, moved_names
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

__version__ = "1.2.0"

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


_LAZY = frozenset({"algorithms", "compat", "datasets", "models", "per_sample"})
"""The sub-packages the spine never imports: each loads on first use (``sbfunc.algorithms``,
``from sbfunc import algorithms``), not with ``import sbfunc``, whose time is a budget
(``benchmarks/import_time.py``; ``tests/test_namespaces.py`` holds the rule)."""

# 1.0's modules that 1.1 folded into the packages: each warns, and so does each of its names,
# until 1.3 (``from sbfunc import passes`` works, ``import sbfunc.passes`` does not)
__getattr__ = moved_names(
    "sbfunc",
    (
        "1.1",
        {
            "passes": Namespace(
                (
                    "sbfunc.engine",
                    (
                        "COMPOSER_PASSES",
                        "DEFAULT_PASSES",
                        "MultipleLossInterpolationWarning",
                        "Pass",
                        "order_by_phase",
                        "phase",
                        "register_pass",
                        "set_filo_order",
                        "sort_fused_layernorm_last",
                        "sort_selective_backprop_first",
                        "sort_to_back",
                        "sort_to_front",
                        "warn_if_multiple_loss_interpolation",
                    ),
                )
            ),
            "rows": Namespace(
                {
                    **{
                        n: f"sbfunc.types:{n}" for n in ("ROWS", "LeafFilter", "PerSample", "Rows")
                    },
                    "check_per_sample": "sbfunc.batch:check_per_sample",
                }
            ),
            "module_io": Namespace(
                (
                    "sbfunc.module",
                    ("Inputs", "Mode", "Output", "draws_randomness", "mode_dependent"),
                )
            ),
            "module_eval": Namespace(
                ("sbfunc.module", ("EvalOutputs", "eval_outputs", "predict"))
            ),
            "module_checks": Namespace(
                (
                    "sbfunc.module",
                    ("TargetKind", "check_loss_fn", "check_state", "check_target", "target_kind"),
                )
            ),
        },
    ),
    lazy=_LAZY,
)


if TYPE_CHECKING:
    from sbfunc import algorithms, compat, datasets, models, per_sample

# The documented modules outside __all__, listed by dir() once imported (sbfunc.testing needs
# hypothesis, sbfunc.distributed is imported on demand)
_NAMESPACES = frozenset({"batch", "distributed", "module", "testing", "types", "validation"})


def __dir__() -> list[str]:  # dir(sbfunc): the API and the imported documented submodules
    return sorted({*__all__, "__version__", *(n for n in _NAMESPACES if n in globals())})
