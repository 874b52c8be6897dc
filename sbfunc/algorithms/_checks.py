"""The batch-field check shared by the algorithms (numbers: :mod:`sbfunc.validation`)."""

from __future__ import annotations

from sbfunc.validation import describe

__all__ = ["check_field"]


def check_field(name: str, field: int | str) -> int | str:
    """``field`` if it is an int (tuple batch) or a str (dict batch), else a ``TypeError``."""
    if isinstance(field, bool) or not isinstance(field, int | str):
        raise TypeError(
            f"{name} must be an int (tuple batch) or a str (dict batch), got {describe(field)}"
        )
    return field
