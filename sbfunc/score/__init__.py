"""Score: cheap per-sample scores of a whole batch (losses, optionally on downsampled inputs),
and Selective Backprop's scoring options (:class:`Scoring`)."""

from sbfunc.score.downsample import (
    check_downsampled_scoring,
    check_scale_factor,
    downsample,
    downsample_batch,
)
from sbfunc.score.losses import score_losses
from sbfunc.score.options import Scoring

__all__ = [
    "Scoring",
    "check_downsampled_scoring",
    "check_scale_factor",
    "downsample",
    "downsample_batch",
    "score_losses",
]


def __dir__() -> list[str]:  # dir() lists the public API, not the module's imports
    return sorted(__all__)
