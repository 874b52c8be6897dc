"""sbfunc: selective backprop and composable training-loop algorithms as pure functions.

The data flow is score -> select -> prune -> step. Every stage is a pure function of explicit
inputs (parameters, buffers, a pytree batch, a random key). The top level holds the spine: the
loss (:func:`per_sample_loss`), the step (:func:`make_train_step`, :class:`TrainState`,
:func:`fit`), :class:`SelectiveBackprop`, :class:`Algorithm` with its events and combinators,
and the sub-packages: :mod:`sbfunc.algorithms` (Composer's suite), :mod:`sbfunc.policies`
(selection policies), :mod:`sbfunc.per_sample` (per-sample gradients on a subset),
:mod:`sbfunc.engine` and :mod:`sbfunc.passes` (events, algorithms, ordering), :mod:`sbfunc.step`,
:mod:`sbfunc.optim` (optimizers and schedules), :mod:`sbfunc.score`, :mod:`sbfunc.select`,
:mod:`sbfunc.checkpoint`, :mod:`sbfunc.datasets`, :mod:`sbfunc.random` and
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
    step,
)
from sbfunc._namespace import deprecated_aliases
from sbfunc.algorithms import SelectiveBackprop
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
from sbfunc.module import per_sample_loss, split_module
from sbfunc.module_eval import predict
from sbfunc.step import fit, make_train_step

__version__ = "1.0.0"

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
    "named_sequence",
    "on_events",
    "optim",
    "passes",
    "per_sample",
    "per_sample_loss",
    "policies",
    "predict",
    "random",
    "schedule_hyperparams",
    "score",
    "select",
    "sequence",
    "split_module",
    "step",
    "when",
]


# The documented modules outside __all__, listed by dir() once imported (sbfunc.testing needs
# hypothesis, sbfunc.distributed is imported on demand)
_NAMESPACES = frozenset(
    {"batch", "distributed", "module", "module_eval", "module_io", "rows", "testing", "types"}
)

# The top-level names of 0.3 that moved to their home module: old name -> "module:Name".
# Each stays one release as a deprecated alias (module __getattr__ below); removed in 1.1.
_MOVED: dict[str, str] = {
    old: f"{home}:{old}"
    for home, names in {
        "sbfunc.algorithms": (
            "EMA", "SAM", "SWA", "Alibi", "AugMix", "BlurPool", "ChannelsLast", "ColOut",
            "CutMix", "CutOut", "GhostBatchNorm", "LabelSmoothing", "LayerFreezing", "MixUp",
            "ProgressiveResizing", "RandAugment", "SeqLengthWarmup", "SqueezeExcite",
            "StochasticDepth", "apply_alibi", "apply_blurpool", "apply_channels_last",
            "apply_ghost_batchnorm", "apply_squeeze_excite", "apply_stochastic_depth",
            "augmix_image", "colout_batch", "cutmix_batch", "cutout_batch", "mixup_batch",
            "randaugment_image", "resize_batch", "sam_gradients", "scale_schedule",
            "set_batch_sequence_length", "smooth_labels", "soft_targets",
        ),
        "sbfunc.compat": ("select_using_loss", "should_selective_backprop"),
        "sbfunc.batch": ("batch_size", "extract", "replace", "take"),
        "sbfunc.score": ("Scoring", "score_losses"),
        "sbfunc.select": ("Selection",),
        "sbfunc.step": (
            "BATCH_EVENTS", "Duration", "FitResult", "StepMetrics", "StepPlan", "TrainStep",
            "weighted_mean",
        ),
        "sbfunc.engine": ("Trace", "run_event"),
        "sbfunc.module": ("LossFn", "ModuleLoss", "Params", "reduce_per_sample"),
        "sbfunc.module_eval": ("EvalOutputs", "eval_outputs"),
    }.items()
    for old in names
}  # fmt: skip


_RENAMED = {
    "State": "sbfunc:Context",
    "chain": "sbfunc:sequence",
    "named_chain": "sbfunc:named_sequence",
    "inject_hyperparams": "sbfunc:schedule_hyperparams",
}
__getattr__ = deprecated_aliases("sbfunc", {**_MOVED, **_RENAMED})


def __dir__() -> list[str]:  # dir(sbfunc): the API and the imported documented submodules
    return sorted({*__all__, "__version__", *(n for n in _NAMESPACES if n in globals())})
