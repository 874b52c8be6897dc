"""The spine: per-sample loss functions ``loss_fn(params, buffers, batch) -> Tensor[N]``.

Every transform in sbfunc (scoring, selection, per-sample gradients, the training step)
consumes a *per-sample loss function*: a pure function of a parameter dict, a buffer dict and a
pytree batch that returns one loss per sample (:class:`sbfunc.types.LossFn`).
:func:`per_sample_loss` bridges an ``nn.Module`` and a criterion to that type with
:func:`torch.func.functional_call` (:class:`ModuleLoss`); :func:`split_module` splits a module
into the two dicts; :func:`predict` and :func:`eval_outputs` evaluate it as a pure function.
The checks (:func:`check_loss_fn`, :func:`check_state`) and the mode helpers
(:func:`module_mode`, :func:`draws_randomness`, :func:`mode_dependent`) are the ones the
transforms above use, for code that builds on this spine.
"""

from sbfunc._namespace import api_dir, moved_names
from sbfunc.module._checks import (
    TargetKind,
    accepts_reduction,
    check_loss_fn,
    check_target,
    target_kind,
)
from sbfunc.module._eval import EvalOutputs, eval_outputs, predict
from sbfunc.module._io import Inputs, Mode, Output, draws_randomness, mode_dependent, module_mode
from sbfunc.module._loss import ModuleLoss, per_sample_loss, reduce_per_sample, split_module
from sbfunc.module._state import check_state
from sbfunc.module._tokens import (
    TokenCrossEntropy,
    TokenLosses,
    next_token_cross_entropy,
    token_cross_entropy,
)

__all__ = [
    "EvalOutputs",
    "Inputs",
    "Mode",
    "ModuleLoss",
    "Output",
    "TargetKind",
    "TokenCrossEntropy",
    "TokenLosses",
    "accepts_reduction",
    "check_loss_fn",
    "check_state",
    "check_target",
    "draws_randomness",
    "eval_outputs",
    "mode_dependent",
    "module_mode",
    "next_token_cross_entropy",
    "per_sample_loss",
    "predict",
    "reduce_per_sample",
    "split_module",
    "target_kind",
    "token_cross_entropy",
]


__getattr__ = moved_names("sbfunc.module", ("1.1", ("sbfunc.types", ("LossFn", "Params"))))
__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
