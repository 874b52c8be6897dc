"""Argument checks shared by the algorithms (each error names the argument, range and value)."""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import TypeVar

__all__ = ["check_bool", "check_choice", "check_classes", "check_field", "check_int", "check_real"]

T = TypeVar("T")


def check_field(name: str, field: int | str) -> int | str:
    """``field`` if it is an int (tuple batch) or a str (dict batch), else a ``TypeError``."""
    if isinstance(field, bool) or not isinstance(field, int | str):
        raise TypeError(f"{name} must be an int (tuple batch) or str (dict batch), got {field!r}")
    return field


def check_int(name: str, value: int, *, low: int) -> int:
    """``value`` if it is an int ``>= low``, else a ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return value


def check_classes(num_classes: int) -> int:
    """``num_classes`` if it is an int ``>= 1``, else a ``ValueError``."""
    return check_int("num_classes", num_classes, low=1)


def check_real(
    name: str,
    value: float,
    *,
    low: float = -math.inf,
    high: float = math.inf,
    open_low: bool = False,
    open_high: bool = False,
) -> float:
    """``value`` as a float if it is a finite real in the interval, else an exception.

    Raises:
        TypeError: if ``value`` is not a finite int or float (bools refused).
        ValueError: if it is outside ``low``..``high`` (ends open as asked).
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TypeError(f"{name} must be a finite float, got {value!r}")
    below = value <= low if open_low else value < low
    above = value >= high if open_high else value > high
    if below or above:
        interval = f"{'(' if open_low else '['}{low}, {high}{')' if open_high else ']'}"
        raise ValueError(f"{name} must be in {interval}, got {value!r}")
    return float(value)


def check_bool(name: str, value: bool) -> bool:
    """``value`` if it is a bool, else a ``TypeError``."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def check_choice(name: str, value: T, choices: Collection[T]) -> T:
    """``value`` if it is one of ``choices``, else a ``ValueError`` listing them."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(map(repr, choices))}, got {value!r}")
    return value
