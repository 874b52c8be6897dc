"""Step: the pure training step, its metrics, evaluation and the loop helper ``fit``.

:func:`make_train_step` builds a :class:`TrainStep`, ``step(state, batch) -> (state,
metrics)``; :func:`fit` runs it over a dataset with Composer's epoch, evaluation and checkpoint
events. :class:`Replicas` is how a step combines with other processes (one process:
:data:`ONE_PROCESS`; data-parallel: :class:`sbfunc.distributed.DataParallel`).
"""

from sbfunc._gradients import weighted_mean
from sbfunc._namespace import api_dir, moved_names
from sbfunc.step._build import make_train_step
from sbfunc.step._evaluation import Evaluation, evaluate
from sbfunc.step._fit_options import Checkpointing, Evaluator
from sbfunc.step._loop import FitResult, fit
from sbfunc.step._microbatch import Microbatching
from sbfunc.step._records import BATCH_EVENTS, NonFinite, StepMetrics, StepPlan
from sbfunc.step._replicas import ONE_PROCESS, Replicas
from sbfunc.step._sequence import NonFiniteRowsWarning, SkippedUpdatesWarning
from sbfunc.step._train_step import TrainStep

__all__ = [
    "BATCH_EVENTS",
    "ONE_PROCESS",
    "Checkpointing",
    "Evaluation",
    "Evaluator",
    "FitResult",
    "Microbatching",
    "NonFinite",
    "NonFiniteRowsWarning",
    "Replicas",
    "SkippedUpdatesWarning",
    "StepMetrics",
    "StepPlan",
    "TrainStep",
    "evaluate",
    "fit",
    "make_train_step",
    "weighted_mean",
]


__getattr__ = moved_names("sbfunc.step", ("1.1", ("sbfunc.engine", ("Duration",))))
__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
