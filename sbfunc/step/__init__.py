"""Step: the pure training step, the loop helper and checkpoints."""

from sbfunc.step import checkpoint
from sbfunc.step.loop import Duration, FitResult, fit
from sbfunc.step.train_step import (
    BATCH_EVENTS,
    Optimizer,
    StepMetrics,
    TrainStep,
    make_train_step,
    weighted_mean,
)

__all__ = [
    "BATCH_EVENTS",
    "Duration",
    "FitResult",
    "Optimizer",
    "StepMetrics",
    "TrainStep",
    "checkpoint",
    "fit",
    "make_train_step",
    "weighted_mean",
]
