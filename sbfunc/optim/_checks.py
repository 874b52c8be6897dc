"""The argument checks the optimizers share (the hyperparameter-or-schedule check, the learning
rate's two spellings, state dtypes) and readable reprs of the optimizers and schedules (number
checks: :mod:`sbfunc.validation`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from sbfunc.validation import check_real
from sbfunc.validation import describe as describe_value

__all__ = ["call_repr", "check_dtype", "check_real_or_schedule", "learning_rate_of"]


def check_real_or_schedule(
    value: Any, name: str, *, low: float = 0.0, open_low: bool = False
) -> float | Callable[..., Any]:
    """Validate a hyperparameter given as a float (``>= low``, or ``> low``) or a schedule
    (any callable, returned unchanged)."""
    if callable(value):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        op = ">" if open_low else ">="
        what = "a float" if low == -math.inf else f"a float {op} {low}"
        raise TypeError(
            f"{name} must be {what} or a schedule (a callable of the step count), got "
            f"{describe_value(value)}"
        )
    return check_real(value, name, low=low, open_low=open_low)


def learning_rate_of(owner: str, lr: Any, learning_rate: Any) -> Any:
    """The one learning rate of ``lr`` (torch's spelling) and ``learning_rate`` (optax's):
    a ``TypeError`` naming both when both or neither are given."""
    if lr is not None and learning_rate is not None:
        raise TypeError(
            f"{owner}() got both lr and learning_rate: they are one argument (torch's and "
            "optax's spelling); give only one"
        )
    if lr is None and learning_rate is None:
        raise TypeError(
            f"{owner}() needs a learning rate: give lr (torch's spelling) or learning_rate "
            "(optax's)"
        )
    return lr if lr is not None else learning_rate


def check_dtype(value: Any, name: str) -> torch.dtype | None:
    """``None`` or a floating-point ``torch.dtype`` (the dtype a state is kept in)."""
    if value is None:
        return None
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise TypeError(
            f"{name} must be None (the parameters' dtype) or a floating torch.dtype such as "
            f"torch.bfloat16, got {describe_value(value)}"
        )
    return value


def call_repr(name: str, args: dict[str, Any]) -> str:
    """``name(k=v, ...)`` with the values' reprs: the repr of an optimizer or a schedule."""
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})"
