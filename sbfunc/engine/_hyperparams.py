"""``schedule_hyperparams``: an algorithm's hyperparameters as schedules, visible in state."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from sbfunc._frozen import replaced
from sbfunc.engine._algorithm import FLAGS, Algorithm, ApplyResult
from sbfunc.engine._events import Event
from sbfunc.engine._state import Context
from sbfunc.engine._trace import unpack_result

__all__ = ["ElapsedSchedule", "schedule_hyperparams"]

ElapsedSchedule = Callable[[float], float]
"""A hyperparameter as a function of ``state.time.elapsed`` (the fraction of training)."""


class _Decided(NamedTuple):
    """An injected algorithm's match decision with the hyperparameter values it was made at."""

    values: tuple[tuple[str, Any], ...]
    decision: Any


_LAST_BUILT: weakref.WeakKeyDictionary[Algorithm, tuple[dict[str, Any], Algorithm]] = (
    weakref.WeakKeyDictionary()
)
"""Each injected algorithm's last ``(values, built algorithm)``: a memo of the pure
``factory(**values)`` (then bound), kept outside the frozen instance."""


class _Injected(Algorithm):
    """Rebuilds ``factory(**values)`` from its state ``(values, part_state)``."""

    def __init__(
        self, factory: Callable[..., Algorithm], hparams: Mapping[str, Any], name: str | None
    ) -> None:
        self.factory = factory
        self.schedules = {k: v for k, v in hparams.items() if callable(v)}
        self.initial = {k: v for k, v in hparams.items() if not callable(v)}
        self.bound: dict[str, Any] | None = None  # the step's loss and spec, once bound
        first = self._build(self._values(0.0, self.initial))
        self.parts = (first,)
        self.name = name if name is not None else f"hyperparams:{first.name}"
        for flag in (*FLAGS, "uses_key"):
            setattr(self, flag, getattr(first, flag))
        # a schedule reads time.elapsed: without the run's length it would stay at its start
        self.uses_elapsed = first.uses_elapsed or bool(self.schedules)

    def _values(self, elapsed: float, stored: Mapping[str, Any]) -> dict[str, Any]:
        values = dict(stored)
        for k, schedule in self.schedules.items():
            values[k] = schedule(elapsed)
        return values

    def _build(self, values: dict[str, Any]) -> Algorithm:
        last = _LAST_BUILT.get(self)
        if last is not None and last[0] == values:
            return last[1]
        alg = self.factory(**values)
        if not isinstance(alg, Algorithm):
            raise TypeError(f"factory must return an sbfunc Algorithm, got {alg!r}")
        if self.bound is not None:
            alg = alg.for_step(**self.bound)
        _LAST_BUILT[self] = (values, alg)
        return alg

    def _current(self, ctx: Context) -> tuple[dict[str, Any], Algorithm]:
        values = self._values(ctx.time.elapsed, ctx.own[0])
        return values, self._build(values)

    def for_step(self, *, loss_fn: Any, per_sample: Any) -> Algorithm:
        bound = {"loss_fn": loss_fn, "per_sample": per_sample}
        return replaced(self, bound=bound, parts=(self.parts[0].for_step(**bound),))

    def init(self, key: Any) -> Any:
        values = self._values(0.0, self.initial)
        return values, self._build(values).init(key)

    def match(self, event: Event, ctx: Context) -> Any:
        values, alg = self._current(ctx)
        decision = alg.match(event, ctx.replace(own=ctx.own[1]))
        # The values travel to apply in the decision: apply sees the time as tensors.
        return _Decided(tuple(values.items()), decision) if decision else decision

    def apply(self, event: Event, ctx: Context) -> ApplyResult:
        matched = ctx.matched
        if isinstance(matched, _Decided):
            values = dict(matched.values)
            alg, ctx = self._build(values), ctx.replace(matched=matched.decision)
        else:  # applied directly, without match: the time is the host's
            values, alg = self._current(ctx)
        out, code = unpack_result(alg.apply(event, ctx.replace(own=ctx.own[1])), alg)
        out = out.replace(own=(values, out.own))
        return out if code is None else (out, code)


def schedule_hyperparams(
    factory: Callable[..., Algorithm], *, name: str | None = None
) -> Callable[..., Algorithm]:
    """Make ``factory``'s keyword hyperparameters live in state, optionally as schedules.

    ``schedule_hyperparams(factory)(**hparams)`` is an algorithm that, on every event, builds
    ``factory(**values)`` and delegates ``match``/``apply`` to it. Its state is
    ``(values, part_state)``: ``values`` are the current hyperparameters (a callable
    hyperparameter is an :data:`ElapsedSchedule` evaluated at ``state.time.elapsed``; any other
    value is read from the state, so editing it there, functionally, changes it) and ``part_state``
    the built algorithm's own state. ``apply`` writes the values it used back. ``factory``
    must be pure (same values, same algorithm): the last build is reused while the values do
    not change (a memo kept outside the algorithm, which stays frozen).

    Under ``torch.compile`` the values are Python numbers baked into the step's graph: a
    schedule that changes its value every step recompiles every step, so prefer schedules
    that change rarely (piecewise constant) for compiled steps.

    Args:
        factory: ``(**hparams) -> Algorithm``, e.g. an ``Algorithm`` subclass.
        name: the name of the injected algorithm (default ``"hyperparams:" + its name``).

    Returns:
        ``(**hparams) -> Algorithm``.

    Raises:
        TypeError: if ``factory`` is not callable or does not return an ``Algorithm``.

    Example:
        >>> from sbfunc.engine import Event, schedule_hyperparams
        >>> from sbfunc.testing import Toy
        >>> alg = schedule_hyperparams(Toy)(tag=lambda t: round(10 * t))
        >>> key = sbfunc.random.key(0)
        >>> ctx = sbfunc.Context(key, own=alg.init(key), time=sbfunc.Time(elapsed=0.3))
        >>> alg.apply(Event.INIT, ctx).own  # (values, the Toy's own log)
        ({'tag': 3}, (3,))

    References:
        optax ``schedule_hyperparams``.
    """
    if not callable(factory):
        raise TypeError(f"factory must be callable (**hparams -> Algorithm), got {factory!r}")

    def build(**hparams: Any) -> Algorithm:
        return _Injected(factory, hparams, name)

    return build
