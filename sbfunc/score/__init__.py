"""Score: cheap per-sample scores of a whole batch (losses, optionally on downsampled inputs),
and Selective Backprop's scoring options (:class:`Scoring`)."""

from sbfunc._namespace import api_dir
from sbfunc.score.downsample import check_downsampled_scoring, downsample, downsample_batch
from sbfunc.score.losses import score_losses
from sbfunc.score.options import Scoring

__all__ = [
    "Scoring",
    "check_downsampled_scoring",
    "downsample",
    "downsample_batch",
    "score_losses",
]


__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
