"""sbfunc: selective backprop and composable training-loop algorithms as pure functions.

The data flow is score -> select -> prune -> step. Every stage is a pure function of explicit
inputs (parameters, buffers, a pytree batch, a random key); the public namespace is flat.
"""

from sbfunc import compat, datasets, random, score, select
from sbfunc.algorithms import cutout_batch, mixup_batch, smooth_labels, soft_targets
from sbfunc.batch import batch_size, extract, replace, take
from sbfunc.compat.composer import select_using_loss, should_selective_backprop
from sbfunc.module import LossFn, Params, per_sample_loss, reduce_per_sample, split_module
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
from sbfunc.step import checkpoint

__version__ = "0.1.0"

__all__ = [
    "LossFn",
    "Params",
    "Selection",
    "batch_size",
    "check_keep",
    "checkpoint",
    "compat",
    "datasets",
    "cutout_batch",
    "extract",
    "gumbel_top_k",
    "kept_count",
    "mixup_batch",
    "per_sample_loss",
    "random",
    "random_subset",
    "rank_power",
    "rank_power_log_weights",
    "ranks",
    "reduce_per_sample",
    "replace",
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
]
