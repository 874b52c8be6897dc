"""Score: cheap per-sample scores of a whole batch (losses, optionally on downsampled inputs)."""

from sbfunc.score.downsample import (
    check_downsampled_scoring,
    check_scale_factor,
    downsample,
    downsample_batch,
)
from sbfunc.score.losses import score_losses

__all__ = [
    "check_downsampled_scoring",
    "check_scale_factor",
    "downsample",
    "downsample_batch",
    "score_losses",
]
