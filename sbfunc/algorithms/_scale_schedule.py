"""Scale schedule: a shorter (or longer) run, with every schedule dilated to fit it.

Composer folded its ``ScaleSchedule`` algorithm into the trainer (``scale_schedule_ratio``):
it multiplies ``max_duration`` by the ratio and stretches the learning-rate schedulers'
milestones by it. In sbfunc the duration is :func:`sbfunc.fit`'s ``epochs``/``steps``
(:class:`sbfunc.engine.Duration`) and schedules are functions of the step count
(:mod:`sbfunc.optim`), so the same change is two calls of :func:`scale_schedule`, one on the
duration and one on each schedule, before building the optimizer. Algorithms that read the
fraction of training done (``time.elapsed``: Selective Backprop's window, layer freezing,
warm-ups, SWA) follow the shorter run by themselves. It is not an algorithm: nothing changes
during the run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, overload

from sbfunc.engine import Duration
from sbfunc.optim import Schedule, stretch_schedule
from sbfunc.validation import check_real

__all__ = ["scale_schedule"]


def _scaled_count(value: int, ratio: float, what: str) -> int:
    scaled = int(value * ratio)
    if scaled < 1:
        raise ValueError(
            f"scale_schedule reduced {what}={value} to {scaled} with ratio={ratio}; use a larger "
            "ratio, or count the duration in steps"
        )
    return scaled


@overload
def scale_schedule(duration_or_schedule: Duration, ratio: float) -> Duration: ...
@overload
def scale_schedule(duration_or_schedule: int, ratio: float) -> int: ...
@overload
def scale_schedule(duration_or_schedule: Callable[[Any], Any], ratio: float) -> Schedule: ...


def scale_schedule(duration_or_schedule: Any, ratio: float) -> Any:
    """Scale a training duration, or dilate a schedule, by ``ratio``.

    * a :class:`sbfunc.engine.Duration` (or a plain count of epochs or steps) becomes
      ``int(value * ratio)`` of the same unit, as Composer scales ``max_duration``;
    * a schedule ``count -> value`` becomes ``count -> schedule(count / ratio)``: with
      ``ratio = 0.5`` a warm-up of 100 steps takes 50 and a decay reaches its end value at half
      the step count. The count reaches the schedule as a 0-d ``float64`` tensor (the
      :mod:`sbfunc.optim` schedules accept it). Composer rounds each milestone down to a whole
      batch instead: the two agree where ``milestone * ratio`` is a whole number.

    Args:
        duration_or_schedule: a ``Duration``, an int, or a schedule (a callable of the count).
        ratio: the scale, ``> 0`` (``< 1`` shortens the run).

    Returns:
        The scaled duration (same type) or the dilated schedule (a :data:`Schedule` with a
        readable repr).

    Raises:
        TypeError: for a ``ratio`` that is not a number, or anything else to scale.
        ValueError: for ``ratio <= 0`` or a duration scaled to zero.

    Example:
        >>> from sbfunc.algorithms import scale_schedule
        >>> scale_schedule(sbfunc.engine.Duration(epochs=10), 0.5)
        Duration(epochs=5, steps=None)
        >>> lr = scale_schedule(sbfunc.optim.linear_schedule(1.0, 0.0, 100), 0.5)
        >>> round(float(lr(25)), 3), round(float(lr(50)), 3)
        (0.5, 0.0)

    References:
        MosaicML Composer ``Trainer(scale_schedule_ratio=...)`` (formerly the
        ``ScaleSchedule`` algorithm); Li et al. 2020, "Budgeted Training: Rethinking Deep
        Neural Network Training Under Resource Constraints".
    """
    ratio = check_real(ratio, "ratio", low=0.0, open_low=True)
    target = duration_or_schedule
    if isinstance(target, Duration):
        if target.epochs is not None:
            return Duration(epochs=_scaled_count(target.epochs, ratio, "epochs"))
        if target.steps is not None:
            return Duration(steps=_scaled_count(target.steps, ratio, "steps"))
        raise ValueError("the Duration must have epochs or steps")
    if isinstance(target, int) and not isinstance(target, bool):
        return _scaled_count(target, ratio, "the duration")
    if callable(target):
        return stretch_schedule(target, ratio)
    raise TypeError(
        "duration_or_schedule must be an sbfunc.engine.Duration, an int or a schedule (a callable "
        f"of the step count), got {type(target).__name__}"
    )
