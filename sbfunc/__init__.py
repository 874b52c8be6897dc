"""sbfunc: selective backprop and composable training-loop algorithms as pure functions.

The data flow is score -> select -> prune -> step. Every stage is a pure function of explicit
inputs (parameters, buffers, a pytree batch, a random key); the public namespace is flat.
Sub-namespaces hold the larger families: :mod:`sbfunc.policies` (selection policies),
:mod:`sbfunc.per_sample` (per-sample gradients on a subset), :mod:`sbfunc.engine` and
:mod:`sbfunc.passes` (events, algorithms, ordering), :mod:`sbfunc.optim` (optimizers and
schedules), :mod:`sbfunc.checkpoint`, :mod:`sbfunc.datasets`, :mod:`sbfunc.random` and
:mod:`sbfunc.compat`.
"""

from sbfunc import (
    checkpoint,
    compat,
    datasets,
    engine,
    optim,
    passes,
    per_sample,
    policies,
    random,
    score,
    select,
)
from sbfunc.algorithms import (
    CutOut,
    LabelSmoothing,
    MixUp,
    SelectiveBackprop,
    cutout_batch,
    mixup_batch,
    smooth_labels,
    soft_targets,
)
from sbfunc.batch import batch_size, extract, replace, take
from sbfunc.compat.composer import select_using_loss, should_selective_backprop
from sbfunc.engine import (
    Algorithm,
    Clock,
    Event,
    State,
    Time,
    Trace,
    TrainState,
    chain,
    during,
    every_n_steps,
    inject_hyperparams,
    named_chain,
    on_events,
    run_event,
    when,
)
from sbfunc.module import (
    LossFn,
    ModuleLoss,
    Params,
    per_sample_loss,
    reduce_per_sample,
    split_module,
)
from sbfunc.score import score_losses
from sbfunc.select import (
    Selection,
    check_keep,
    gumbel_top_k,
    kept_count,
    random_subset,
    rank_power,
    rank_power_log_weights,
    ranks,
    top_k,
)
from sbfunc.step import (
    BATCH_EVENTS,
    Duration,
    FitResult,
    StepMetrics,
    StepPlan,
    TrainStep,
    fit,
    make_train_step,
    weighted_mean,
)

__version__ = "0.2.0"

__all__ = [
    "BATCH_EVENTS",
    "Algorithm",
    "Clock",
    "CutOut",
    "Duration",
    "Event",
    "FitResult",
    "LabelSmoothing",
    "LossFn",
    "MixUp",
    "ModuleLoss",
    "Params",
    "Selection",
    "SelectiveBackprop",
    "State",
    "StepMetrics",
    "StepPlan",
    "Time",
    "Trace",
    "TrainState",
    "TrainStep",
    "batch_size",
    "chain",
    "check_keep",
    "checkpoint",
    "compat",
    "cutout_batch",
    "datasets",
    "during",
    "engine",
    "every_n_steps",
    "extract",
    "fit",
    "gumbel_top_k",
    "inject_hyperparams",
    "kept_count",
    "make_train_step",
    "mixup_batch",
    "named_chain",
    "on_events",
    "optim",
    "passes",
    "per_sample",
    "per_sample_loss",
    "policies",
    "random",
    "random_subset",
    "rank_power",
    "rank_power_log_weights",
    "ranks",
    "reduce_per_sample",
    "replace",
    "run_event",
    "score",
    "score_losses",
    "select",
    "select_using_loss",
    "should_selective_backprop",
    "smooth_labels",
    "soft_targets",
    "split_module",
    "take",
    "top_k",
    "weighted_mean",
    "when",
]
