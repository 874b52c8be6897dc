"""Score: cheap per-sample scores of a whole batch (losses, optionally on downsampled inputs),
the per-row signals some policies read besides (:class:`Signals`: logits, penultimate
features, targets), and Selective Backprop's scoring options (:class:`Scoring`)."""

from sbfunc._namespace import api_dir
from sbfunc.score._downsample import (
    check_downsampled_scoring,
    check_scale_factor,
    downsample,
    downsample_batch,
)
from sbfunc.score._losses import score_losses
from sbfunc.score._options import Scoring, check_scoring
from sbfunc.score._signals import (
    SIGNALS,
    Signals,
    SignalScorer,
    check_needs,
    check_signals,
    score_signals,
)

__all__ = [
    "SIGNALS",
    "Scoring",
    "SignalScorer",
    "Signals",
    "check_downsampled_scoring",
    "check_needs",
    "check_scale_factor",
    "check_scoring",
    "check_signals",
    "downsample",
    "downsample_batch",
    "score_losses",
    "score_signals",
]


__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
