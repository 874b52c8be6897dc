"""The hyperparameter-or-schedule check and readable reprs of the optimizers and schedules
(number checks: :mod:`sbfunc.validation`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sbfunc.validation import check_real
from sbfunc.validation import describe as describe_value

__all__ = ["check_real_or_schedule", "describe"]


def check_real_or_schedule(
    value: Any, name: str, *, low: float = 0.0, open_low: bool = False
) -> float | Callable[..., Any]:
    """Validate a hyperparameter given as a float (``>= low``, or ``> low``) or a schedule
    (any callable, returned unchanged)."""
    if callable(value):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        op = ">" if open_low else ">="
        raise TypeError(
            f"{name} must be a float {op} {low} or a schedule (a callable of the step "
            f"count), got {describe_value(value)}"
        )
    return check_real(value, name, low=low, open_low=open_low)


def describe(name: str, args: dict[str, Any]) -> str:
    """``name(k=v, ...)`` with the values' reprs: the repr of an optimizer or a schedule."""
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})"
