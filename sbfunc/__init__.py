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
    algorithms,
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
    EMA,
    SAM,
    SWA,
    Alibi,
    AugMix,
    BlurPool,
    ChannelsLast,
    ColOut,
    CutMix,
    CutOut,
    GhostBatchNorm,
    LabelSmoothing,
    LayerFreezing,
    MixUp,
    ProgressiveResizing,
    RandAugment,
    SelectiveBackprop,
    SeqLengthWarmup,
    SqueezeExcite,
    StochasticDepth,
    apply_alibi,
    apply_blurpool,
    apply_channels_last,
    apply_ghost_batchnorm,
    apply_squeeze_excite,
    apply_stochastic_depth,
    augmix_image,
    colout_batch,
    cutmix_batch,
    cutout_batch,
    mixup_batch,
    randaugment_image,
    resize_batch,
    sam_gradients,
    scale_schedule,
    set_batch_sequence_length,
    smooth_labels,
    soft_targets,
)
from sbfunc.batch import batch_size, extract, replace, take
from sbfunc.compat.composer import select_using_loss, should_selective_backprop
from sbfunc.engine import (
    Algorithm,
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
from sbfunc.module_eval import EvalOutputs, eval_outputs, predict
from sbfunc.score import Scoring, score_losses
from sbfunc.select import Selection
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

__version__ = "0.3.1"

__all__ = [
    "BATCH_EVENTS",
    "EMA",
    "SAM",
    "SWA",
    "Algorithm",
    "Alibi",
    "AugMix",
    "BlurPool",
    "ChannelsLast",
    "ColOut",
    "CutMix",
    "CutOut",
    "Duration",
    "EvalOutputs",
    "Event",
    "FitResult",
    "GhostBatchNorm",
    "LabelSmoothing",
    "LayerFreezing",
    "LossFn",
    "MixUp",
    "ModuleLoss",
    "Params",
    "ProgressiveResizing",
    "RandAugment",
    "Scoring",
    "Selection",
    "SelectiveBackprop",
    "SeqLengthWarmup",
    "SqueezeExcite",
    "State",
    "StepMetrics",
    "StepPlan",
    "StochasticDepth",
    "Time",
    "Trace",
    "TrainState",
    "TrainStep",
    "algorithms",
    "apply_alibi",
    "apply_blurpool",
    "apply_channels_last",
    "apply_ghost_batchnorm",
    "apply_squeeze_excite",
    "apply_stochastic_depth",
    "augmix_image",
    "batch_size",
    "chain",
    "checkpoint",
    "colout_batch",
    "compat",
    "cutmix_batch",
    "cutout_batch",
    "datasets",
    "during",
    "engine",
    "eval_outputs",
    "every_n_steps",
    "extract",
    "fit",
    "inject_hyperparams",
    "make_train_step",
    "mixup_batch",
    "named_chain",
    "on_events",
    "optim",
    "passes",
    "per_sample",
    "per_sample_loss",
    "policies",
    "predict",
    "randaugment_image",
    "random",
    "reduce_per_sample",
    "replace",
    "resize_batch",
    "run_event",
    "sam_gradients",
    "scale_schedule",
    "score",
    "score_losses",
    "select",
    "select_using_loss",
    "set_batch_sequence_length",
    "should_selective_backprop",
    "smooth_labels",
    "soft_targets",
    "split_module",
    "take",
    "weighted_mean",
    "when",
]


# The documented submodules outside __all__, listed by dir() once imported (sbfunc.testing
# needs hypothesis, sbfunc.distributed is imported on demand)
_NAMESPACES = frozenset(
    {"batch", "distributed", "module", "module_checks", "module_eval", "module_io", "rows"}
    | {"step", "testing"}
)


def __dir__() -> list[str]:  # dir(sbfunc): the API and the imported documented submodules
    return sorted({*__all__, "__version__", *(n for n in _NAMESPACES if n in globals())})
