"""Weight averaging: EMA and SWA keep averaged parameters in their own state.

Both fill their state from the parameters on ``INIT`` (which ``step.init`` fires, so the
state's structure is fixed from then on and checkpoints with the rest), update it on
``BATCH_END`` or ``EPOCH_END`` when the host schedule in ``match`` says so, and never touch the
trained parameters: read the averaged model with ``alg.averaged(state, step)`` (for
evaluation, or to continue training from it with ``state.replace(params=...)``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

import torch

from sbfunc.engine import Algorithm, Context, Event, Time, TrainState
from sbfunc.types import Params
from sbfunc.validation import check_real

__all__ = ["EMA", "SWA", "AveragedState"]

Unit = Literal["ba", "ep"]
_PERIOD = re.compile(r"^\s*(\d+)\s*(ba|ep)\s*$")
_DURATION = re.compile(r"^\s*([0-9.eE+-]+)\s*dur\s*$")


def _period(value: Any, name: str) -> tuple[int, Unit]:
    """``"10ba"`` (batches) or ``"1ep"`` (epochs) -> ``(10, "ba")``; at least 1."""
    found = _PERIOD.match(value) if isinstance(value, str) else None
    if found is None or int(found.group(1)) < 1:
        raise ValueError(
            f"{name} must be a time string like '10ba' or '1ep' (>= 1), got {value!r}"
        )
    return int(found.group(1)), found.group(2)  # type: ignore[return-value]


def _fraction(value: Any, name: str) -> float:
    """A fraction of training: a float in [0, 1] or Composer's ``"0.7dur"``."""
    if isinstance(value, str):
        found = _DURATION.match(value)
        if found is None:
            raise ValueError(
                f"{name} must be a fraction in [0, 1] or like '0.7dur', got {value!r}"
            )
        value = float(found.group(1))
    return check_real(value, name, low=0.0, high=1.0)


class AveragedState(NamedTuple):
    """The own state of :class:`EMA` and :class:`SWA`.

    Attributes:
        params: the averaged parameters (the initial ones until the first update).
        buffers: the averaged floating-point buffers (EMA), or ``{}`` (SWA).
        num_updates: a 0-d ``int64`` tensor: the updates averaged so far.
    """

    params: Params
    buffers: Params
    num_updates: torch.Tensor


def _lerp(average: Params, new: Params, weight: torch.Tensor) -> Params:
    return {k: torch.lerp(a, new[k], weight.to(a.dtype)) for k, a in average.items()}


class _Averaging(Algorithm):
    """Shared parts: the INIT snapshot, the update schedule and the reader."""

    unit: Unit
    every: int

    def _averages_buffers(self) -> bool:
        return False

    def _in_window(self, elapsed: float) -> bool:
        raise NotImplementedError

    def _weight(self, count: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _floating(self, buffers: Params) -> Params:
        if not self._averages_buffers():
            return {}
        return {k: v.clone() for k, v in buffers.items() if v.is_floating_point()}

    def init(self, key: Any) -> None:
        return None  # filled on INIT, from the parameters

    events = frozenset({Event.INIT, Event.BATCH_END, Event.EPOCH_END})
    uses_elapsed = True

    def match(self, event: Event, ctx: Context) -> bool:
        if event == Event.INIT:
            return True
        update = Event.BATCH_END if self.unit == "ba" else Event.EPOCH_END
        if event != update or not self._in_window(ctx.time.elapsed):
            return False
        return _count(ctx.time, self.unit) % self.every == 0

    def apply(self, event: Event, ctx: Context) -> Context:
        if event == Event.INIT:
            count = torch.zeros((), dtype=torch.int64, device=ctx.key.device)
            own = AveragedState(
                {k: v.clone() for k, v in ctx.params.items()},
                self._floating(ctx.buffers),
                count,
            )
            return ctx.replace(own=own)
        own = ctx.own
        if not isinstance(own, AveragedState):
            raise RuntimeError(f"{self.name}: no averaged state; INIT (step.init) must run first")
        weight = self._weight(own.num_updates)
        return ctx.replace(
            own=AveragedState(
                _lerp(own.params, ctx.params, weight),
                _lerp(own.buffers, ctx.buffers, weight),
                own.num_updates + 1,
            )
        )

    def averaged(self, state: TrainState, algorithms: Any) -> tuple[Params, Params]:
        """The averaged model ``(params, buffers)`` held in ``state``.

        Buffers that are not averaged (all for SWA; integer ones for EMA) are the state's.

        Args:
            state: a train state of a step that runs this algorithm.
            algorithms: that step (or its algorithm list); this algorithm must be one of its
                top-level algorithms (inside a combinator, read ``AveragedState`` yourself).

        Raises:
            ValueError: if this algorithm is not in ``algorithms``.
        """
        listed: Sequence[Algorithm] = getattr(algorithms, "algorithms", algorithms)
        for i, alg in enumerate(listed):
            if alg is self:
                own = state.algorithm_state[i]
                if not isinstance(own, AveragedState):
                    raise RuntimeError(f"{self.name}: no averaged state; run step.init first")
                return {**state.params, **own.params}, {**state.buffers, **own.buffers}
        raise ValueError(f"{self!r} is not a top-level algorithm of {algorithms!r}")


def _count(time: Time, unit: Unit) -> int:
    """Batches (``BATCH_END`` sees the finished step) or epochs finished so far."""
    return time.step if unit == "ba" else time.epoch + 1


class EMA(_Averaging):
    """An exponential moving average of the parameters (and floating-point buffers).

    On its update event (``BATCH_END`` for an ``update_interval`` in batches, ``EPOCH_END``
    for epochs), once ``elapsed >= ema_start`` and when the count of batches (epochs) done is a
    multiple of the interval, ``average <- smoothing * average + (1 - smoothing) * current``;
    the first update copies the current values (Composer starts its average from a copy of
    the model). ``smoothing = 2 ** (-interval / half_life)``. The trained parameters never
    change: read the average with :meth:`averaged` (Composer swaps it into the model for
    evaluation and checkpoints). Integer buffers (``num_batches_tracked``) are not averaged.

    Args:
        half_life: the half life, a time string like ``"1000ba"`` or ``"2ep"``; default
            ``"1000ba"`` unless ``smoothing`` is given.
        smoothing: the weight kept per update, in ``[0, 1)`` (``0``: the average is the last
            value), instead of ``half_life``.
        ema_start: fraction of training before the first update (float or ``"0.5dur"``).
        update_interval: a time string; default one unit of ``half_life`` (``"1ba"`` with
            ``smoothing``).

    Example:
        >>> from sbfunc.algorithms import EMA
        >>> ema = EMA(smoothing=0.5)
        >>> ctx = sbfunc.Context(sbfunc.random.key(0), params={"w": torch.zeros(2)})
        >>> ctx = ema.apply(sbfunc.Event.INIT, ctx)
        >>> for w in (1.0, 3.0):  # the first update copies, the second averages
        ...     ctx = ctx.replace(params={"w": torch.full((2,), w)})
        ...     ctx = ema.apply(sbfunc.Event.BATCH_END, ctx)
        >>> ctx.own.params["w"], int(ctx.own.num_updates)
        (tensor([2., 2.]), 2)

    References:
        Polyak and Juditsky 1992 (iterate averaging); MosaicML Composer ``EMA``.
    """

    def __init__(
        self,
        half_life: str | None = None,
        smoothing: float | None = None,
        ema_start: float | str = 0.0,
        update_interval: str | None = None,
    ) -> None:
        if half_life is not None and smoothing is not None:
            raise ValueError(
                f"give half_life or smoothing, not both; got half_life={half_life!r}, "
                f"smoothing={smoothing!r}"
            )
        if half_life is None and smoothing is None:
            half_life = "1000ba"
        self.start = _fraction(ema_start, "ema_start")
        life = None if half_life is None else _period(half_life, "half_life")
        if update_interval is not None:
            self.every, self.unit = _period(update_interval, "update_interval")
        else:
            self.every, self.unit = (1, "ba") if life is None else (1, life[1])
        if life is not None:
            if life[1] != self.unit:
                raise ValueError(
                    f"half_life ({half_life!r}) and update_interval ({update_interval!r}) must "
                    "use the same unit"
                )
            smoothing = 2.0 ** (-self.every / life[0])
        self.smoothing = check_real(smoothing, "smoothing", low=0.0, high=1.0, open_high=True)

    def _averages_buffers(self) -> bool:
        return True

    def _in_window(self, elapsed: float) -> bool:
        return elapsed >= self.start

    def _weight(self, count: torch.Tensor) -> torch.Tensor:
        one = torch.ones((), dtype=torch.float32, device=count.device)
        return torch.where(count == 0, one, one * (1.0 - self.smoothing))

    def __repr__(self) -> str:
        return (
            f"EMA(smoothing={self.smoothing}, ema_start={self.start}, "
            f"update_interval='{self.every}{self.unit}')"
        )


class SWA(_Averaging):
    """Stochastic weight averaging: the plain mean of the parameters at regular times.

    On its update event (``BATCH_END`` or ``EPOCH_END``, by ``update_interval``), while
    ``swa_start <= elapsed < swa_end`` and when the count of batches (epochs) done is a
    multiple of the interval, ``average <- average + (current - average) / (n + 1)`` (the first
    update copies). Buffers are not averaged (as ``torch.optim.swa_utils.AveragedModel``);
    recompute BatchNorm statistics for the averaged parameters with a forward pass over
    training data before using them. Differences from Composer: the trained parameters are
    not replaced by the average at ``swa_end`` (read it with :meth:`averaged`; continue from it
    with ``state.replace(params=...)``), the interval counts the run's batches or epochs
    rather than SWA's own updates, and the SWA learning-rate schedule is the optimizer's:
    build it with :func:`sbfunc.optim.join_schedules`.

    Args:
        swa_start: fraction of training before averaging starts (float or ``"0.7dur"``).
        swa_end: fraction at which averaging stops, ``> swa_start``.
        update_interval: a time string like ``"1ep"`` or ``"10ba"``.

    Example:
        >>> from sbfunc.algorithms import SWA
        >>> swa = SWA(swa_start=0.0, swa_end=1.0, update_interval="1ba")
        >>> ctx = sbfunc.Context(sbfunc.random.key(0), params={"w": torch.zeros(1)})
        >>> ctx = swa.apply(sbfunc.Event.INIT, ctx)
        >>> for w in (1.0, 2.0, 6.0):
        ...     ctx = ctx.replace(params={"w": torch.tensor([w])})
        ...     ctx = swa.apply(sbfunc.Event.BATCH_END, ctx)
        >>> ctx.own.params["w"]
        tensor([3.])

    References:
        Izmailov et al. 2018, "Averaging Weights Leads to Wider Optima and Better
        Generalization"; MosaicML Composer ``SWA``; PyTorch ``torch.optim.swa_utils``.
    """

    def __init__(
        self,
        swa_start: float | str = 0.7,
        swa_end: float | str = 0.97,
        update_interval: str = "1ep",
    ) -> None:
        self.start = _fraction(swa_start, "swa_start")
        self.end = _fraction(swa_end, "swa_end")
        if self.end <= self.start:
            raise ValueError(f"swa_end must be > swa_start={self.start}, got {self.end}")
        self.every, self.unit = _period(update_interval, "update_interval")

    def _in_window(self, elapsed: float) -> bool:
        return self.start <= elapsed < self.end

    def _weight(self, count: torch.Tensor) -> torch.Tensor:
        return 1.0 / (count + 1).to(torch.float32)

    def __repr__(self) -> str:
        return (
            f"SWA(swa_start={self.start}, swa_end={self.end}, "
            f"update_interval='{self.every}{self.unit}')"
        )
