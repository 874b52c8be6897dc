"""Schedules made of schedules: ``join_schedules``, the warm-up-then-cosine schedule and
``stretch_schedule``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from sbfunc.optim._checks import call_repr
from sbfunc.optim._schedules import (
    NamedSchedule,
    Schedule,
    cosine_decay_schedule,
    linear_schedule,
    value_at,
)
from sbfunc.validation import check_int, check_real

__all__ = ["join_schedules", "stretch_schedule", "warmup_cosine_decay_schedule"]


def _join(
    schedules: Sequence[Callable[[Any], Any]], boundaries: Sequence[int]
) -> Callable[[torch.Tensor], torch.Tensor]:
    def fn(count: torch.Tensor) -> torch.Tensor:
        value = value_at(schedules[0], count)
        for boundary, schedule in zip(boundaries, schedules[1:], strict=True):
            value = torch.where(count < boundary, value, value_at(schedule, count - boundary))
        return value

    return fn


def join_schedules(schedules: Sequence[Schedule], boundaries: Sequence[int]) -> Schedule:
    """Run ``schedules[i]`` from ``boundaries[i - 1]`` on, on the steps since that boundary.

    Before ``boundaries[0]`` the value is ``schedules[0](t)``; from ``boundaries[i - 1]`` to
    ``boundaries[i]`` it is ``schedules[i](t - boundaries[i - 1])``.

    Args:
        schedules: one or more schedules (callables of the step count).
        boundaries: ``len(schedules) - 1`` non-decreasing step counts.

    Returns:
        A :data:`Schedule` (``count -> 0-d float64 tensor``) with a readable repr.

    Raises:
        TypeError: for non-callable schedules or non-int boundaries.
        ValueError: for no schedules, a wrong number of boundaries or decreasing ones.

    Example:
        >>> from sbfunc import optim
        >>> s = optim.join_schedules(
        ...     [optim.linear_schedule(0.0, 1.0, 2), optim.constant_schedule(0.5)], [3])
        >>> [s(t).item() for t in range(5)]
        [0.0, 0.5, 1.0, 0.5, 0.5]

    References:
        DeepMind optax ``join_schedules``.
    """
    schedules = tuple(schedules)
    bounds = tuple(check_int(b, "a boundary of boundaries") for b in boundaries)
    if not schedules:
        raise ValueError("schedules must hold at least one schedule, got none")
    for s in schedules:
        if not callable(s):
            raise TypeError(f"schedules must be callables of the step count, got {s!r}")
    if len(bounds) != len(schedules) - 1:
        raise ValueError(
            f"boundaries must hold len(schedules) - 1 = {len(schedules) - 1} step counts, "
            f"got {len(bounds)}"
        )
    if list(bounds) != sorted(bounds):
        raise ValueError(f"boundaries must be non-decreasing, got {list(bounds)}")
    text = call_repr("join_schedules", {"schedules": list(schedules), "boundaries": list(bounds)})
    return NamedSchedule(_join(schedules, bounds), text)


def warmup_cosine_decay_schedule(
    init: float,
    peak: float,
    warmup_steps: int,
    decay_steps: int,
    *,
    end: float = 0.0,
    exponent: float = 1.0,
) -> Schedule:
    """Linear warm-up from ``init`` to ``peak``, then cosine decay to ``end``.

    The warm-up is ``linear_schedule(init, peak, warmup_steps)``; from step ``warmup_steps``
    on, ``cosine_decay_schedule(peak, decay_steps - warmup_steps, alpha=end / peak)`` runs on
    the steps since the warm-up (``alpha = 0`` when ``peak == 0``), as in optax.

    Args:
        init: the value at step 0.
        peak: the value at step ``warmup_steps``.
        warmup_steps: the warm-up length, ``>= 0``.
        decay_steps: the total length (warm-up included), ``> warmup_steps``.
        end: the value from step ``decay_steps`` on.
        exponent: the power of the cosine factor.

    Returns:
        A :data:`Schedule` (``count -> 0-d float64 tensor``) with a readable repr.

    Raises:
        TypeError: for non-numbers or non-int step counts.
        ValueError: for non-finite values, ``warmup_steps < 0`` or
            ``decay_steps <= warmup_steps``.

    Example:
        >>> from sbfunc import optim
        >>> s = optim.warmup_cosine_decay_schedule(0.0, 1.0, 2, 6, end=0.1)
        >>> [round(s(t).item(), 3) for t in range(8)]
        [0.0, 0.5, 1.0, 0.868, 0.55, 0.232, 0.1, 0.1]

    References:
        DeepMind optax ``warmup_cosine_decay_schedule``; Loshchilov and Hutter 2017, "SGDR";
        Goyal et al. 2017, "Accurate, Large Minibatch SGD" (linear warm-up).
    """
    init = check_real(init, "init")
    peak = check_real(peak, "peak")
    warmup = check_int(warmup_steps, "warmup_steps", low=0)
    total = check_int(decay_steps, "decay_steps")
    if total <= warmup:
        raise ValueError(
            f"decay_steps (the total length, warm-up included) must be > warmup_steps="
            f"{warmup}, got {total!r}"
        )
    end = check_real(end, "end")
    exponent = check_real(exponent, "exponent")
    alpha = 0.0 if peak == 0.0 else end / peak
    warm = linear_schedule(init, peak, warmup)
    decay = cosine_decay_schedule(peak, total - warmup, alpha=alpha, exponent=exponent)
    text = call_repr(
        "warmup_cosine_decay_schedule",
        {
            "init": init,
            "peak": peak,
            "warmup_steps": warmup,
            "decay_steps": total,
            "end": end,
            "exponent": exponent,
        },
    )
    return NamedSchedule(_join((warm, decay), (warmup,)), text)


def stretch_schedule(schedule: Callable[[Any], Any], ratio: float) -> Schedule:
    """``schedule`` stretched in time by ``ratio``: its value at step ``c`` is
    ``schedule(c / ratio)`` (``ratio < 1`` runs it faster, over a shorter run), evaluated with
    tensor ops on a float64 count, so a compiled step compiles once.

    Args:
        schedule: any schedule (a callable of the step count).
        ratio: the stretch, ``> 0``.

    Returns:
        The stretched :data:`Schedule`, with a readable repr.

    Raises:
        TypeError: for a ``schedule`` that is not callable or a ``ratio`` that is not a number.
        ValueError: for ``ratio <= 0``.

    Example:
        >>> lr = sbfunc.optim.stretch_schedule(sbfunc.optim.linear_schedule(1.0, 0.0, 100), 0.5)
        >>> round(float(lr(25)), 3), lr
        (0.5, stretch_schedule(schedule=linear_schedule(init=1.0, end=0.0, ...), ratio=0.5))

    References:
        MosaicML Composer ``Trainer(scale_schedule_ratio=...)``.
    """
    if not callable(schedule):
        raise TypeError(f"schedule must be a callable of the step count, got {schedule!r:.60}")
    ratio = check_real(ratio, "ratio", low=0.0, open_low=True)

    def stretched(count: torch.Tensor) -> torch.Tensor:
        return value_at(schedule, count.to(torch.float64) / ratio)

    return NamedSchedule(
        stretched, call_repr("stretch_schedule", {"schedule": schedule, "ratio": ratio})
    )
