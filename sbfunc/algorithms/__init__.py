"""Training-loop algorithms (Composer's, in functional form) and their pure batch transforms."""

from sbfunc.algorithms.augment import cutout_batch, mixup_batch, smooth_labels, soft_targets
from sbfunc.algorithms.composer_algorithms import CutOut, LabelSmoothing, MixUp
from sbfunc.algorithms.selective_backprop import SelectiveBackprop

__all__ = [
    "CutOut",
    "LabelSmoothing",
    "MixUp",
    "SelectiveBackprop",
    "cutout_batch",
    "mixup_batch",
    "smooth_labels",
    "soft_targets",
]
