"""Training-loop algorithms (Composer's, in functional form) and their pure batch transforms."""

from sbfunc.algorithms.augment import cutout_batch, mixup_batch, smooth_labels, soft_targets

__all__ = ["cutout_batch", "mixup_batch", "smooth_labels", "soft_targets"]
