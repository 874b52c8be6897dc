"""Deprecated in 1.1: this module's names live on :mod:`sbfunc.module`; each warns, and is
removed in 1.2."""

from sbfunc._namespace import moved_names

__getattr__ = moved_names(
    "sbfunc.module_eval",
    ("1.1", ("sbfunc.module", ("EvalOutputs", "eval_outputs", "predict"))),
)


def __dir__() -> list[str]:
    return []
