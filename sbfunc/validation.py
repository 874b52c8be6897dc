"""Argument checks with one convention, used by every sbfunc constructor and function.

* ``TypeError`` for a value of the wrong type. A bool is not a number (``True`` is refused
  where a float or an int is expected), a str is not a number (``"0.5"`` is refused), and a
  float is not an int (``2.0`` is refused where an int is expected).
* ``ValueError`` for a value of the right type outside the allowed range. NaN is outside
  every range, and so are the infinities unless a bound says otherwise: a NaN fraction
  raises ``ValueError``, like ``2`` does.
* Every message reads ``"<name> must be <what is allowed>, got <what was given>; <fix>"``:
  it names the argument, the allowed range or type, the value received and how to fix it.

Each checker returns the value it accepted (ints and floats as Python ``float`` for the real
checkers), so a constructor validates and stores in one line::

    self.keep = check_fraction(keep, "keep", open_low=True)
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any, TypeVar

import torch

from sbfunc._namespace import api_dir

__all__ = [
    "check_bool",
    "check_callable",
    "check_choice",
    "check_fraction",
    "check_int",
    "check_real",
    "check_tensor",
    "describe",
    "interval",
]

T = TypeVar("T")


def describe(value: Any) -> str:
    """A short description of ``value`` for an error message: its repr (at most 60
    characters) and, unless the repr shows it, its type.

    Example:
        >>> sbfunc.validation.describe("0.5"), sbfunc.validation.describe(True)
        ("'0.5' (a str)", 'True (a bool)')
        >>> sbfunc.validation.describe(torch.zeros(2, 3))
        'a torch.float32 tensor of shape (2, 3)'
    """
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    if type(value) in (int, float, type(None)):
        return text
    return f"{text} (a {type(value).__name__})"


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def interval(
    low: float = -math.inf,
    high: float = math.inf,
    *,
    open_low: bool = False,
    open_high: bool = False,
) -> str:
    """The text of an allowed range: ``"in (0, 1]"``, ``">= 1"``, ``"> 0"`` or ``""``.

    Example:
        >>> from sbfunc.validation import interval
        >>> interval(0, 1, open_low=True), interval(1), interval(0, open_low=True)
        ('in (0, 1]', '>= 1', '> 0')
    """
    has_low, has_high = math.isfinite(low), math.isfinite(high)
    if has_low and has_high:
        lo, hi = "(" if open_low else "[", ")" if open_high else "]"
        return f"in {lo}{_number(low)}, {_number(high)}{hi}"
    if has_low:
        return f"{'>' if open_low else '>='} {_number(low)}"
    if has_high:
        return f"{'<' if open_high else '<='} {_number(high)}"
    return ""


def _fail(
    error: type[Exception], name: str, wanted: str, value: Any, fix: str | None
) -> Exception:
    """The exception for ``name``: ``"<name> must be <wanted>, got <value>; <fix>"``."""
    tail = f"; {fix}" if fix else ""
    return error(f"{name} must be {wanted}, got {describe(value)}{tail}")


def _number_fix(value: Any, fix: str | None) -> str | None:
    """The fix for a value given where a number was expected, unless the caller has one."""
    if fix is not None:
        return fix
    if isinstance(value, bool):
        return "a bool is not a number here"
    if isinstance(value, torch.Tensor):
        return "pass a Python number (read a tensor once, outside the step, with .item())"
    if isinstance(value, str):
        return "pass the number, not its text"
    if isinstance(value, float) and value.is_integer():
        return f"pass the int {int(value)}"
    return None


def _real_range(low: float, high: float, open_low: bool, open_high: bool, typed: bool) -> str:
    """``"a float in [0, 1]"`` (``"in [0, 1]"`` when the type was right), ``"a finite float >=
    0"``."""
    bound = interval(low, high, open_low=open_low, open_high=open_high)
    if bound.startswith("in"):
        return bound if typed else f"a float {bound}"
    return f"a finite float {bound}".rstrip()


def _int_range(low: int | None, high: int | None) -> str:
    bound = interval(-math.inf if low is None else low, math.inf if high is None else high)
    return f"an int {bound}".rstrip()


def check_real(
    value: Any,
    name: str,
    *,
    low: float = -math.inf,
    high: float = math.inf,
    open_low: bool = False,
    open_high: bool = False,
    fix: str | None = None,
) -> float:
    """Validate a finite real number (an int or a float, not a bool) in the given range and
    return it as a float.

    Args:
        value: the argument.
        name: its name, for the message.
        low: the lower bound (``-inf``: none).
        high: the upper bound (``inf``: none).
        open_low: exclude ``low`` itself.
        open_high: exclude ``high`` itself.
        fix: how to fix a bad value, appended to the message.

    Returns:
        ``float(value)``.

    Raises:
        TypeError: for anything but an int or a float (a bool, a str, a tensor).
        ValueError: for NaN, an infinity, or a value outside the range.

    Example:
        >>> from sbfunc.validation import check_real
        >>> check_real(3, "alpha", low=0)
        3.0
        >>> check_real(float("nan"), "alpha", low=0)
        Traceback (most recent call last):
        ...
        ValueError: alpha must be a finite float >= 0, got nan
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        wanted = _real_range(low, high, open_low, open_high, typed=False)
        raise _fail(TypeError, name, wanted, value, _number_fix(value, fix))
    v = float(value)
    below = v <= low if open_low else v < low
    above = v >= high if open_high else v > high
    if not math.isfinite(v) or below or above:
        wanted = _real_range(low, high, open_low, open_high, typed=True)
        raise _fail(ValueError, name, wanted, value, fix)
    return v


def check_fraction(
    value: Any,
    name: str,
    *,
    low: float = 0.0,
    high: float = 1.0,
    open_low: bool = False,
    open_high: bool = False,
    fix: str | None = None,
) -> float:
    """Validate a fraction, a float in ``[0, 1]`` by default (the ends can be opened or moved),
    and return it as a float: :func:`check_real` with the bounds of a fraction.

    Raises:
        TypeError: for anything but an int or a float (a bool, a str, a tensor).
        ValueError: for NaN or a value outside the range.

    Example:
        >>> from sbfunc.validation import check_fraction
        >>> check_fraction(0.25, "keep", open_low=True)
        0.25
        >>> check_fraction(True, "keep", open_low=True)
        Traceback (most recent call last):
        ...
        TypeError: keep must be a float in (0, 1], got True (a bool); a bool is not a number here
    """
    return check_real(
        value, name, low=low, high=high, open_low=open_low, open_high=open_high, fix=fix
    )


def check_int(
    value: Any,
    name: str,
    *,
    low: int | None = None,
    high: int | None = None,
    fix: str | None = None,
) -> int:
    """Validate an int (not a bool, not a float) in ``[low, high]`` and return it.

    Args:
        value: the argument.
        name: its name, for the message.
        low: the least value allowed (``None``: no bound).
        high: the largest value allowed (``None``: no bound).
        fix: how to fix a bad value, appended to the message.

    Raises:
        TypeError: for anything but an int (a bool, a float such as ``2.0``, a str).
        ValueError: below ``low`` or above ``high``.

    Example:
        >>> from sbfunc.validation import check_int
        >>> check_int(1024, "history", low=1)
        1024
        >>> check_int(0, "history", low=1)
        Traceback (most recent call last):
        ...
        ValueError: history must be an int >= 1, got 0
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(TypeError, name, _int_range(low, high), value, _number_fix(value, fix))
    if (low is not None and value < low) or (high is not None and value > high):
        raise _fail(ValueError, name, _int_range(low, high), value, fix)
    return value


def check_bool(value: Any, name: str, *, fix: str | None = None) -> bool:
    """Validate a bool (``True`` or ``False``, not ``0``/``1``) and return it.

    Raises:
        TypeError: for anything else.

    Example:
        >>> sbfunc.validation.check_bool(1, "reweight")
        Traceback (most recent call last):
        ...
        TypeError: reweight must be True or False, got 1
    """
    if not isinstance(value, bool):
        raise _fail(TypeError, name, "True or False", value, fix)
    return value


def check_choice(value: T, name: str, choices: Collection[T], *, fix: str | None = None) -> T:
    """Validate that ``value`` is one of ``choices`` and return it.

    Raises:
        ValueError: for another value (the message lists the choices).

    Example:
        >>> sbfunc.validation.check_choice("ignore", "nonfinite", ("skip", "raise", "allow"))
        Traceback (most recent call last):
        ...
        ValueError: nonfinite must be one of 'allow', 'raise', 'skip', got 'ignore' (a str)
    """
    try:
        ok = value in choices
    except TypeError:  # an unhashable value looked up in a set
        ok = False
    if not ok:
        listed = ", ".join(sorted(repr(c) for c in choices))
        raise _fail(ValueError, name, f"one of {listed}", value, fix)
    return value


def check_callable(value: T, name: str, *, fix: str | None = None) -> T:
    """Validate that ``value`` is callable and return it.

    Raises:
        TypeError: for a value that cannot be called.

    Example:
        >>> sbfunc.validation.check_callable(None, "loss_fn", fix="use sbfunc.per_sample_loss")
        Traceback (most recent call last):
        ...
        TypeError: loss_fn must be callable, got None; use sbfunc.per_sample_loss
    """
    if not callable(value):
        raise _fail(TypeError, name, "callable", value, fix)
    return value


def check_tensor(
    value: Any,
    name: str,
    *,
    dim: int | None = None,
    size: int | None = None,
    floating: bool | None = None,
    dtype: torch.dtype | None = None,
    fix: str | None = None,
) -> torch.Tensor:
    """Validate a tensor's type, rank, leading size and dtype, and return it.

    Args:
        value: the argument.
        name: its name, for the message.
        dim: the number of dimensions required (``None``: any).
        size: the size of the first dimension required (``None``: any).
        floating: require a floating dtype (``True``) or an integer one (``False``, bools
            excluded); ``None``: any.
        dtype: require exactly this dtype.
        fix: how to fix a bad value, appended to the message.

    Raises:
        TypeError: for a non-tensor, or a tensor of the wrong dtype.
        ValueError: for a tensor of the wrong rank or size.

    Example:
        >>> from sbfunc.validation import check_tensor
        >>> check_tensor(torch.zeros(3), "scores", dim=1, floating=True).shape
        torch.Size([3])
        >>> check_tensor(torch.zeros(2, 3), "scores", dim=1)
        Traceback (most recent call last):
        ...
        ValueError: scores must be a 1-D tensor, got a torch.float32 tensor of shape (2, 3)
    """
    words = [
        "" if dim is None else f"{dim}-D",
        {None: "", True: "floating", False: "integer"}[floating] if dtype is None else str(dtype),
        "tensor" if size is None else f"tensor with {size} rows",
    ]
    text = " ".join(w for w in words if w)
    wanted = f"{'an' if text[0] in 'aeiou' else 'a'} {text}"
    if not isinstance(value, torch.Tensor):
        raise _fail(TypeError, name, wanted, value, fix)
    wrong_kind = (dtype is not None and value.dtype != dtype) or (
        floating is not None
        and (value.dtype.is_floating_point != floating or value.dtype == torch.bool)
    )
    if wrong_kind:
        raise _fail(TypeError, name, wanted, value, fix)
    if (dim is not None and value.dim() != dim) or (
        size is not None and (value.dim() == 0 or value.shape[0] != size)
    ):
        raise _fail(ValueError, name, wanted, value, fix)
    return value


__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
