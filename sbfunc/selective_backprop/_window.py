"""Selective Backprop's schedule: the window ``[start, end)`` of training and the interrupt
period (Composer's ``should_selective_backprop``)."""

from __future__ import annotations

from sbfunc.validation import check_fraction, check_int

__all__ = ["check_window", "in_window", "should_selective_backprop"]


def check_window(start: float, end: float, interrupt: int) -> None:
    """Validate a Selective Backprop schedule (``start <= end`` in [0, 1], ``interrupt`` 0 or
    >= 2); shared by :func:`should_selective_backprop` and the ``SelectiveBackprop`` algorithm.
    """
    check_fraction(start, "start")
    check_fraction(end, "end")
    if start > end:
        raise ValueError(f"start must be <= end, got start={start}, end={end}; swap them")
    never = "0 (never interrupt) or an int >= 2"
    check_int(interrupt, "interrupt", fix=f"pass {never}")
    if interrupt < 0 or interrupt == 1:
        raise ValueError(
            f"interrupt must be 0 (never interrupt) or an int >= 2, got {interrupt} "
            "(interrupt=1 would interrupt every batch, so selective backprop would never run)"
        )


def in_window(d: float, b: int, start: float, end: float, interrupt: int) -> bool:
    """Composer's rule without the checks: ``start <= d < end`` and, unless ``interrupt`` is
    0, ``(b + 1) % interrupt != 0`` (the host-side decision of the ``SelectiveBackprop``
    algorithm, whose arguments were checked at construction).
    """
    return start <= d < end and (interrupt == 0 or (b + 1) % interrupt != 0)


def should_selective_backprop(
    current_duration: float,
    batch_idx: int,
    start: float = 0.5,
    end: float = 0.9,
    interrupt: int = 2,
) -> bool:
    """Whether Selective Backprop runs on this batch: ``start <= current_duration < end`` and,
    unless ``interrupt == 0``, ``(batch_idx + 1) % interrupt != 0``.

    Composer-compatible (same signature and result on valid input), but arguments are validated:
    ``interrupt`` of 1 (which would silently never select) or below 0 raises.

    Args:
        current_duration: elapsed fraction of training, in [0, 1].
        batch_idx: index of the batch inside the epoch, >= 0 (the pattern restarts per epoch).
        start: start of the half-open window ``[start, end)``.
        end: end of the window.
        interrupt: run a plain step every ``interrupt`` batches; 0 never interrupts.

    Example:
        >>> [sbfunc.selective_backprop.should_selective_backprop(0.6, b) for b in range(4)]
        [True, False, True, False]

    References:
        Jiang et al. 2019; MosaicML Composer ``should_selective_backprop``.
    """
    check_window(start, end, interrupt)
    check_fraction(current_duration, "current_duration")
    check_int(batch_idx, "batch_idx", low=0)
    return in_window(current_duration, batch_idx, start, end, interrupt)
