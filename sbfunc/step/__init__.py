"""Step: the pure training step and the loop helper."""

from sbfunc._namespace import api_dir
from sbfunc.step.build import make_train_step
from sbfunc.step.evaluation import Evaluation, evaluate
from sbfunc.step.gradients import weighted_mean
from sbfunc.step.loop import Duration, FitResult, fit
from sbfunc.step.sequence import NonFiniteRowsWarning
from sbfunc.step.train_step import BATCH_EVENTS, StepMetrics, StepPlan, TrainStep

__all__ = [
    "BATCH_EVENTS",
    "Duration",
    "Evaluation",
    "FitResult",
    "NonFiniteRowsWarning",
    "StepMetrics",
    "StepPlan",
    "TrainStep",
    "evaluate",
    "fit",
    "make_train_step",
    "weighted_mean",
]


__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
