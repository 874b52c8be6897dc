"""Argument validation and readable reprs shared by the optimizers and the schedules."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

__all__ = ["check_bool", "check_int", "check_real", "check_real_or_schedule", "describe"]


def check_real(
    value: Any,
    name: str,
    *,
    low: float = -math.inf,
    high: float = math.inf,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """Validate a finite real number in the given interval and return it as a float.

    Raises:
        TypeError: for a non-number (or a bool).
        ValueError: for a non-finite value or one outside the interval (the message shows
            the interval and the value received).
    """
    lo = "(" if low_open else "["
    hi = ")" if high_open else "]"
    interval = f"a finite float in {lo}{low}, {high}{hi}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be {interval}, got {value!r}")
    value = float(value)
    below = value <= low if low_open else value < low
    above = value >= high if high_open else value > high
    if not math.isfinite(value) or below or above:
        raise ValueError(f"{name} must be {interval}, got {value!r}")
    return value


def check_real_or_schedule(
    value: Any, name: str, *, low: float = 0.0, low_open: bool = False
) -> float | Callable[..., Any]:
    """Validate a hyperparameter given as a float (``>= low``, or ``> low``) or a schedule
    (any callable, returned unchanged)."""
    if callable(value):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        op = ">" if low_open else ">="
        raise TypeError(
            f"{name} must be a float {op} {low} or a schedule (a callable of the step "
            f"count), got {value!r}"
        )
    return check_real(value, name, low=low, low_open=low_open)


def check_int(value: Any, name: str, *, low: int | None = None) -> int:
    """Validate an int (``>= low`` when given) and return it.

    Raises:
        TypeError: for a non-int (or a bool).
        ValueError: below ``low``.
    """
    wanted = "an int" if low is None else f"an int >= {low}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be {wanted}, got {value!r}")
    if low is not None and value < low:
        raise ValueError(f"{name} must be {wanted}, got {value!r}")
    return value


def check_bool(value: Any, name: str) -> bool:
    """Validate a bool and return it.

    Raises:
        TypeError: for anything but ``True`` or ``False``.
    """
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value


def describe(name: str, args: dict[str, Any]) -> str:
    """``name(k=v, ...)`` with the values' reprs: the repr of an optimizer or a schedule."""
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})"
