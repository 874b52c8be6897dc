"""Hyperparameter schedules: pure functions of the step count, with optax's definitions.

A schedule maps the number of optimizer steps taken, a 0-d int64 tensor (the optimizer
state's ``count``) or a Python int, to a 0-d float64 tensor on the count's device. It is
computed with tensor ops only, so a compiled training step traces it once: the step count
never becomes a Python number (which would recompile the step at every step).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from sbfunc.optim._checks import call_repr
from sbfunc.validation import check_bool, check_int, check_real

__all__ = [
    "NamedSchedule",
    "Schedule",
    "constant_schedule",
    "cosine_decay_schedule",
    "exponential_decay",
    "linear_schedule",
    "piecewise_constant_schedule",
    "polynomial_schedule",
    "value_at",
]

Schedule = Callable[[Any], torch.Tensor]
"""``count -> value``: the step count (a 0-d int64 tensor or an int) to a 0-d float tensor."""

_F64 = torch.float64


def _count(count: Any) -> torch.Tensor:
    if isinstance(count, torch.Tensor):
        if count.dim() != 0:
            raise ValueError(f"count must be a 0-d tensor, got shape {tuple(count.shape)}")
        return count
    if isinstance(count, bool) or not isinstance(count, int):
        raise TypeError(f"count must be an int or a 0-d int64 tensor, got {count!r}")
    return torch.tensor(count, dtype=torch.int64)


def value_at(schedule: Callable[[Any], Any], count: torch.Tensor) -> torch.Tensor:
    """A schedule's value at ``count`` as a 0-d float64 tensor on the count's device (also for
    user schedules that return a Python number or a float32 tensor)."""
    out = schedule(count)
    if isinstance(out, torch.Tensor):
        return out.to(device=count.device, dtype=_F64)
    return torch.full((), float(out), dtype=_F64, device=count.device)


class NamedSchedule:
    """A schedule with a readable repr; counts are checked and ints made tensors first."""

    __slots__ = ("_fn", "_text")

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor], text: str) -> None:
        self._fn = fn
        self._text = text

    def __call__(self, count: torch.Tensor | int) -> torch.Tensor:
        return self._fn(_count(count))

    def __repr__(self) -> str:
        return self._text


def _steps(count: torch.Tensor) -> torch.Tensor:
    return count.to(_F64)


def _constant(value: float) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda count: torch.full((), value, dtype=_F64, device=count.device)


def constant_schedule(value: float) -> Schedule:
    """The schedule that is ``value`` at every step.

    Args:
        value: the value.

    Returns:
        A :data:`Schedule` (``count -> 0-d float64 tensor``) with a readable repr.

    Raises:
        TypeError: for a non-number.
        ValueError: for a non-finite value.

    Example:
        >>> from sbfunc import optim
        >>> optim.constant_schedule(0.1)(7)
        tensor(0.1000, dtype=torch.float64)

    References:
        DeepMind optax ``constant_schedule``.
    """
    value = check_real(value, "value")
    return NamedSchedule(_constant(value), call_repr("constant_schedule", {"value": value}))


def _polynomial(
    init: float, end: float, power: float, steps: int, begin: int
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``(init - end) * (1 - clip(t - begin, 0, steps) / steps) ** power + end``."""

    def fn(count: torch.Tensor) -> torch.Tensor:
        t = (_steps(count) - begin).clamp(0, steps)
        frac = 1 - t / steps
        return (init - end) * (frac if power == 1 else frac**power) + end

    return fn


def _transition(
    name: str, init: Any, end: Any, power: Any, transition_steps: Any, transition_begin: Any
) -> Schedule:
    """The checked polynomial transition of :func:`linear_schedule` (``power=None``: 1, not
    shown) and :func:`polynomial_schedule`; constant at ``init`` for ``transition_steps <= 0``
    (optax's rule)."""
    start, stop = ("init", "end") if power is None else ("init_value", "end_value")
    args: dict[str, Any] = {start: check_real(init, start), stop: check_real(end, stop)}
    if power is not None:
        args["power"] = check_real(power, "power")
    args["transition_steps"] = steps = check_int(transition_steps, "transition_steps")
    args["transition_begin"] = begin = check_int(transition_begin, "transition_begin", low=0)
    text = call_repr(name, args)
    if steps <= 0:
        return NamedSchedule(_constant(args[start]), text)
    exponent = 1.0 if power is None else args["power"]
    return NamedSchedule(_polynomial(args[start], args[stop], exponent, steps, begin), text)


def linear_schedule(
    init: float, end: float, transition_steps: int, *, transition_begin: int = 0
) -> Schedule:
    """Linear interpolation from ``init`` to ``end`` over ``transition_steps`` steps.

    The value is ``init`` up to step ``transition_begin``, then moves linearly to ``end``,
    which it reaches at step ``transition_begin + transition_steps`` and keeps:
    ``(init - end) * (1 - clip(t - B, 0, T) / T) + end``. With ``transition_steps <= 0`` the
    schedule is constant at ``init`` (optax's rule).

    Args:
        init: the value before and at ``transition_begin``.
        end: the value from ``transition_begin + transition_steps`` on.
        transition_steps: the length of the transition, in steps.
        transition_begin: steps at ``init`` before the transition starts, ``>= 0``.

    Returns:
        A :data:`Schedule` (``count -> 0-d float64 tensor``) with a readable repr.

    Raises:
        TypeError: for non-numbers or non-int step counts.
        ValueError: for non-finite values or a negative ``transition_begin`` (optax replaces
            it by 0).

    Example:
        >>> from sbfunc import optim
        >>> s = optim.linear_schedule(1.0, 0.0, 4, transition_begin=2)
        >>> [round(s(t).item(), 2) for t in range(8)]
        [1.0, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0, 0.0]

    References:
        DeepMind optax ``linear_schedule`` and ``polynomial_schedule`` (``power=1``).
    """
    return _transition("linear_schedule", init, end, None, transition_steps, transition_begin)


def polynomial_schedule(
    init_value: float,
    end_value: float,
    power: float,
    transition_steps: int,
    *,
    transition_begin: int = 0,
) -> Schedule:
    """A polynomial transition of power ``power`` from ``init_value`` to ``end_value``.

    ``(I - E) * (1 - clip(t - B, 0, T) / T) ** power + E``, optax's definition (in float64):
    ``I`` up to step ``B = transition_begin``, ``E`` from step ``B + T`` on; ``power=1`` is
    :func:`linear_schedule`, ``power=2`` decays fast first, ``power=0.5`` slowly first. With
    ``transition_steps <= 0`` the schedule is constant at ``init_value`` (optax's rule).

    Args:
        init_value: ``I``, the value up to ``transition_begin``.
        end_value: ``E``, the value from ``transition_begin + transition_steps`` on.
        power: the power of the transition, a finite float.
        transition_steps: ``T``, the length of the transition, in steps.
        transition_begin: ``B``, steps at ``init_value`` before the transition, ``>= 0``.

    Returns:
        A :data:`Schedule` with a readable repr, as :func:`linear_schedule`.

    Raises:
        TypeError: as :func:`linear_schedule`, and for a non-number ``power``.
        ValueError: as :func:`linear_schedule` (a negative ``transition_begin`` too, where
            optax takes 0), and for a non-finite ``power``.

    Example:
        >>> from sbfunc import optim
        >>> s = optim.polynomial_schedule(1.0, 0.01, 2, 100, transition_begin=5)
        >>> [round(s(t).item(), 4) for t in (0, 5, 6, 104, 105, 110)]
        [1.0, 1.0, 0.9803, 0.0101, 0.01, 0.01]

    References:
        DeepMind optax ``polynomial_schedule``; TensorFlow ``PolynomialDecay``.
    """
    return _transition(
        "polynomial_schedule", init_value, end_value, power, transition_steps, transition_begin
    )


def _cosine(
    init: float, decay_steps: int, alpha: float, exponent: float
) -> Callable[[torch.Tensor], torch.Tensor]:
    def fn(count: torch.Tensor) -> torch.Tensor:
        t = _steps(count).clamp(max=decay_steps)
        cosine = 0.5 * (1 + torch.cos(math.pi * t / decay_steps))
        return init * ((1 - alpha) * cosine**exponent + alpha)

    return fn


def cosine_decay_schedule(
    init: float, decay_steps: int, *, alpha: float = 0.0, exponent: float = 1.0
) -> Schedule:
    """Cosine decay from ``init`` to ``alpha * init`` over ``decay_steps`` steps.

    ``init * ((1 - alpha) * (0.5 * (1 + cos(pi * min(t, T) / T))) ** exponent + alpha)``.

    Args:
        init: the value at step 0.
        decay_steps: ``T``, the steps the decay takes, ``> 0``; the value stays at
            ``alpha * init`` afterwards.
        alpha: the final value as a fraction of ``init``.
        exponent: the power of the cosine factor.

    Returns:
        A :data:`Schedule` (``count -> 0-d float64 tensor``) with a readable repr.

    Raises:
        TypeError: for non-numbers or a non-int ``decay_steps``.
        ValueError: for non-finite values or ``decay_steps <= 0``.

    Example:
        >>> from sbfunc import optim
        >>> s = optim.cosine_decay_schedule(1.0, 4, alpha=0.1)
        >>> [round(s(t).item(), 3) for t in range(6)]
        [1.0, 0.868, 0.55, 0.232, 0.1, 0.1]

    References:
        DeepMind optax ``cosine_decay_schedule``; Loshchilov and Hutter 2017, "SGDR:
        Stochastic Gradient Descent with Warm Restarts".
    """
    init = check_real(init, "init")
    steps = check_int(decay_steps, "decay_steps", low=1)
    alpha = check_real(alpha, "alpha")
    exponent = check_real(exponent, "exponent")
    text = call_repr(
        "cosine_decay_schedule",
        {"init": init, "decay_steps": steps, "alpha": alpha, "exponent": exponent},
    )
    return NamedSchedule(_cosine(init, steps, alpha, exponent), text)


def exponential_decay(
    init: float,
    transition_steps: int,
    decay_rate: float,
    *,
    transition_begin: int = 0,
    staircase: bool = False,
    end: float | None = None,
) -> Schedule:
    """Exponential decay: ``init * decay_rate ** ((t - B) / T)`` from step ``B`` on.

    The value is ``init`` up to step ``transition_begin``; with ``staircase`` the exponent is
    rounded down (the value drops every ``transition_steps`` steps). ``end`` bounds the value:
    from below when ``decay_rate < 1``, from above otherwise.

    Args:
        init: the value up to ``transition_begin``.
        transition_steps: ``T``, the steps over which the value is multiplied by
            ``decay_rate``, ``> 0``.
        decay_rate: the factor per ``transition_steps`` steps, ``> 0``.
        transition_begin: ``B``, steps at ``init`` before the decay starts, ``>= 0``.
        staircase: decay in discrete jumps.
        end: an optional bound on the value (see above).

    Returns:
        A :data:`Schedule` (``count -> 0-d float64 tensor``) with a readable repr.

    Raises:
        TypeError: for non-numbers, non-int step counts or a non-bool ``staircase``.
        ValueError: for non-finite values, ``transition_steps <= 0``, ``decay_rate <= 0`` or
            ``transition_begin < 0`` (optax silently falls back to a constant or to 0 there).

    Example:
        >>> from sbfunc import optim
        >>> s = optim.exponential_decay(1.0, 2, 0.5, staircase=True, end=0.3)
        >>> [s(t).item() for t in range(6)]
        [1.0, 1.0, 0.5, 0.5, 0.3, 0.3]

    References:
        DeepMind optax ``exponential_decay``; TensorFlow ``ExponentialDecay``.
    """
    init = check_real(init, "init")
    steps = check_int(transition_steps, "transition_steps", low=1)
    rate = check_real(decay_rate, "decay_rate", low=0.0, open_low=True)
    begin = check_int(transition_begin, "transition_begin", low=0)
    staircase = check_bool(staircase, "staircase")
    bound = None if end is None else check_real(end, "end")

    def fn(count: torch.Tensor) -> torch.Tensor:
        elapsed = _steps(count) - begin
        p = elapsed / steps
        if staircase:
            p = p.floor()
        value = torch.where(elapsed <= 0, init, init * torch.pow(rate, p))
        if bound is None:
            return value
        return value.clamp(min=bound) if rate < 1 else value.clamp(max=bound)

    text = call_repr(
        "exponential_decay",
        {
            "init": init,
            "transition_steps": steps,
            "decay_rate": rate,
            "transition_begin": begin,
            "staircase": staircase,
            "end": bound,
        },
    )
    return NamedSchedule(fn, text)


def piecewise_constant_schedule(
    init: float, boundaries_and_scales: Mapping[int, float] | None = None
) -> Schedule:
    """``init`` times the product of the scales of all boundaries reached (``t >= b``).

    Args:
        init: the value before the first boundary.
        boundaries_and_scales: ``{step: scale}``; from ``step`` on, the value is multiplied by
            ``scale`` (``>= 0``). ``None`` or ``{}``: constant.

    Returns:
        A :data:`Schedule` (``count -> 0-d float64 tensor``) with a readable repr.

    Raises:
        TypeError: for non-numbers, non-int boundaries or a non-mapping.
        ValueError: for non-finite values or a negative scale.

    Example:
        >>> from sbfunc import optim
        >>> s = optim.piecewise_constant_schedule(1.0, {2: 0.5, 4: 0.1})
        >>> [s(t).item() for t in range(6)]
        [1.0, 1.0, 0.5, 0.5, 0.05, 0.05]

    References:
        DeepMind optax ``piecewise_constant_schedule``; PyTorch ``MultiStepLR``.
    """
    init = check_real(init, "init")
    if boundaries_and_scales is None:
        boundaries_and_scales = {}
    if not isinstance(boundaries_and_scales, Mapping):
        raise TypeError(
            f"boundaries_and_scales must be a mapping {{step: scale}}, got "
            f"{boundaries_and_scales!r}"
        )
    pairs = sorted(
        (
            check_int(b, "a boundary of boundaries_and_scales"),
            check_real(s, f"the scale at boundary {b}", low=0.0),
        )
        for b, s in boundaries_and_scales.items()
    )

    def fn(count: torch.Tensor) -> torch.Tensor:
        value = torch.full((), init, dtype=_F64, device=count.device)
        for boundary, scale in pairs:
            value = torch.where(count >= boundary, value * scale, value)
        return value

    text = call_repr(
        "piecewise_constant_schedule", {"init": init, "boundaries_and_scales": dict(pairs)}
    )
    return NamedSchedule(fn, text)
