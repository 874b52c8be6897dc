"""Gradient transformations on torch's own foreach kernels, optimizers built from them, and
schedules of their hyperparameters.

optax's design: ``opt = sbfunc.optim.adam(1e-3)``; ``state = opt.init(params)``;
``updates, state = opt.update(grads, state, params)``;
``params = sbfunc.optim.apply_updates(params, updates)``. Parameters, gradients and updates are
``dict[str, Tensor]``; a :class:`GradientTransformation` maps gradients to updates and never
modifies its inputs, and :func:`chain` composes them (the state is the tuple of the parts'
states). :func:`sgd`, :func:`adam`, :func:`adamw`, :func:`decoupled_sgdw` and
:func:`decoupled_adamw` are such chains of torch.optim's (and Composer's) formulas and
rounding: ``adam`` gives ``torch.optim.Adam``'s parameters bit for bit; the others keep
torch's momentum buffers and moments bit for bit for the same inputs, and their parameters
differ by one rounding per step, where torch fuses the parameter into its last kernel (see
each function). A learning rate (or
weight decay) may be a schedule, a function of the state's step count evaluated with tensor ops,
so a compiled step compiles once. :func:`apply_if_finite` (skip non-finite updates) and
:func:`multi_steps` (gradient accumulation, skipping micro-steps with :func:`skip_not_finite`
or :func:`skip_large_updates`) wrap a transformation, and so do :func:`dynamic_loss_scale`
(float16 training's loss scale, ``torch.amp.GradScaler``), :func:`masked` (a transformation on
some parameters: no-decay groups, and freezing with :func:`set_to_zero`) and
:func:`inject_hyperparams` (hyperparameters kept in the state, where they can be changed).
The optimizers take the learning rate as ``lr`` (torch's spelling) or ``learning_rate``
(optax's).

``update`` is differentiable (torch.func can differentiate through it); call it under
``torch.no_grad()`` when the parameters require grad and no gradient through the step is wanted.
"""

from sbfunc._finite import all_finite, keep_if_finite
from sbfunc._namespace import api_dir, moved_names
from sbfunc.optim._accumulate import ItemsState, MultiStepsState, multi_steps, takes_items
from sbfunc.optim._adam import adam, adamw, decoupled_adamw
from sbfunc.optim._apply_if_finite import ApplyIfFiniteState, apply_if_finite
from sbfunc.optim._base import (
    GradientTransformation,
    TransformRecord,
    apply_updates,
    chain,
)
from sbfunc.optim._clip import ClipFormula, clip_by_global_norm
from sbfunc.optim._inject import InjectHyperparamsState, inject_hyperparams
from sbfunc.optim._join import join_schedules, stretch_schedule, warmup_cosine_decay_schedule
from sbfunc.optim._loss_scale import (
    LossScaleState,
    dynamic_loss_scale,
    loss_scale,
    scales_loss,
    state_on_skip,
    unscale,
)
from sbfunc.optim._masking import MaskedState, masked, set_to_zero
from sbfunc.optim._moments import ScaleByAdamState, TraceState, scale_by_adam, trace
from sbfunc.optim._rms import ScaleByRmsState, scale_by_rms
from sbfunc.optim._schedules import (
    Schedule,
    constant_schedule,
    cosine_decay_schedule,
    exponential_decay,
    linear_schedule,
    piecewise_constant_schedule,
    polynomial_schedule,
)
from sbfunc.optim._sgd import decoupled_sgdw, sgd
from sbfunc.optim._skip import ShouldSkipUpdateFn, skip_large_updates, skip_not_finite
from sbfunc.optim._transforms import (
    ScaleByScheduleState,
    add_decayed_weights,
    decoupled_weight_decay,
    scale,
    scale_by_learning_rate,
)

Optimizer = GradientTransformation
"""The former name of :class:`GradientTransformation` (kept for the type hints that use it)."""

__all__ = [
    "ApplyIfFiniteState",
    "ClipFormula",
    "GradientTransformation",
    "InjectHyperparamsState",
    "ItemsState",
    "LossScaleState",
    "MaskedState",
    "MultiStepsState",
    "Optimizer",
    "ScaleByAdamState",
    "ScaleByRmsState",
    "ScaleByScheduleState",
    "Schedule",
    "ShouldSkipUpdateFn",
    "TraceState",
    "TransformRecord",
    "adam",
    "adamw",
    "add_decayed_weights",
    "all_finite",
    "apply_if_finite",
    "apply_updates",
    "chain",
    "clip_by_global_norm",
    "constant_schedule",
    "cosine_decay_schedule",
    "decoupled_adamw",
    "decoupled_sgdw",
    "decoupled_weight_decay",
    "dynamic_loss_scale",
    "exponential_decay",
    "inject_hyperparams",
    "join_schedules",
    "keep_if_finite",
    "linear_schedule",
    "loss_scale",
    "masked",
    "multi_steps",
    "piecewise_constant_schedule",
    "polynomial_schedule",
    "scale",
    "scale_by_adam",
    "scale_by_learning_rate",
    "scale_by_rms",
    "scales_loss",
    "set_to_zero",
    "sgd",
    "skip_large_updates",
    "skip_not_finite",
    "state_on_skip",
    "stretch_schedule",
    "takes_items",
    "trace",
    "unscale",
    "warmup_cosine_decay_schedule",
]


__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
__getattr__ = moved_names("sbfunc.optim", ("1.2", ("sbfunc.types", ("EmptyState",))))
