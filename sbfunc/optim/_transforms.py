"""The stateless gradient transformations (up to a step count for schedules): scaling, the
learning rate, and weight decay coupled and decoupled (clipping by the global norm:
:mod:`sbfunc.optim._clip`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from sbfunc._tracing import replace_by_constructor
from sbfunc.optim._base import (
    EmptyState,
    GradientTransformation,
    Scalar,
    TransformRecord,
    by_group,
    counted,
    hyperparam_at,
    need_params,
    scalar_like,
    zero_count,
)
from sbfunc.optim._checks import check_real_or_schedule
from sbfunc.optim._masking import Mask, masked
from sbfunc.optim._schedules import value_at
from sbfunc.types import Params
from sbfunc.validation import check_bool, check_real

__all__ = [
    "HParam",
    "ScaleByScheduleState",
    "Stateless",
    "add_decayed_weights",
    "check_initial_lr",
    "decoupled_weight_decay",
    "scale",
    "scale_by_learning_rate",
    "times",
]

HParam = float | Callable[[Any], torch.Tensor]
"""A hyperparameter: a float, or a schedule of the step count (:mod:`sbfunc.optim`)."""


@replace_by_constructor  # its copies survive a compiled frame on torch 2.11
class ScaleByScheduleState(NamedTuple):
    """The step count of a transformation with a scheduled hyperparameter.

    Attributes:
        count: 0-d int64 tensor, the updates made, on the parameters' device.

    Example:
        >>> from sbfunc import optim
        >>> optim.scale_by_learning_rate(optim.constant_schedule(0.1)).init({"w": torch.ones(1)})
        ScaleByScheduleState(count=tensor(0))

    References:
        DeepMind optax ``ScaleByScheduleState``.
    """

    count: torch.Tensor  # type: ignore[assignment]  # (shadows tuple.count, as in optax)


def _count_state(*values: Any) -> Callable[[Params], Any]:
    """``init`` of a transformation whose hyperparameters are ``values``: a step count when
    one is a schedule, else :class:`EmptyState`."""
    if counted(*values):
        return lambda params: ScaleByScheduleState(zero_count(params))
    return lambda params: EmptyState()


def _next(state: Any) -> Any:
    return (
        state._replace(count=state.count + 1) if isinstance(state, ScaleByScheduleState) else state
    )


def times(xs: list[torch.Tensor], factor: Scalar) -> list[torch.Tensor]:
    """``factor * x`` for every tensor (a tensor factor cast to their dtype first)."""
    return list(torch._foreach_mul(xs, scalar_like(factor, xs[0]))) if xs else []  # type: ignore[arg-type]


def _plus(x: list[torch.Tensor], y: list[torch.Tensor], alpha: Scalar) -> list[torch.Tensor]:
    """``x + alpha * y``: one fused ``add(alpha=...)`` for a float ``alpha`` (as torch.optim),
    a multiply then an add for a tensor one (torch.optim's compiled path)."""
    if not isinstance(alpha, torch.Tensor):
        return list(torch._foreach_add(x, y, alpha=alpha))
    scaled = times(y, alpha)
    torch._foreach_add_(scaled, x)
    return scaled


@dataclasses.dataclass(frozen=True, repr=False)
class Stateless(TransformRecord):
    """A transformation without state: ``update`` is :meth:`apply` of the updates alone."""

    def init(self, params: Params) -> EmptyState:
        return EmptyState()

    def update(
        self, updates: Params, state: EmptyState, params: Params | None = None
    ) -> tuple[Params, EmptyState]:
        return self.apply(updates), state

    def apply(self, updates: Params) -> Params:
        raise NotImplementedError


@dataclasses.dataclass(frozen=True, repr=False)
class _Scale(TransformRecord):
    step_size: HParam

    def init(self, params: Params) -> Any:
        return _count_state(self.step_size)(params)

    def update(
        self, updates: Params, state: Any, params: Params | None = None
    ) -> tuple[Params, Any]:
        factor = hyperparam_at(self.step_size, getattr(state, "count", None))
        return by_group(lambda u: (times(u, factor),), updates)[0], _next(state)


def scale(step_size: HParam) -> GradientTransformation:
    """Multiply the updates by a constant, optax's ``scale``: ``u -> step_size * u``.

    Args:
        step_size: the factor, a finite float (``-1.0`` maximizes instead of minimizing), or a
            schedule of the step count (what :func:`inject_hyperparams` passes).

    Returns:
        A :class:`GradientTransformation` with state :class:`EmptyState`
        (:class:`ScaleByScheduleState` for a schedule).

    Raises:
        TypeError: if ``step_size`` is neither a float nor a callable.
        ValueError: if it is not finite.

    Example:
        >>> from sbfunc import optim
        >>> optim.scale(-2.0).update({"w": torch.ones(2)}, sbfunc.types.EmptyState())[0]
        {'w': tensor([-2., -2.])}

    References:
        DeepMind optax ``scale``.
    """
    step = check_real_or_schedule(step_size, "step_size", low=-math.inf)
    return _Scale(name="scale", step_size=step).transformation()


@dataclasses.dataclass(frozen=True, repr=False)
class _ScaleByLearningRate(TransformRecord):
    learning_rate: HParam
    flip_sign: bool = True

    def init(self, params: Params) -> Any:
        return _count_state(self.learning_rate)(params)

    def update(
        self, updates: Params, state: Any, params: Params | None = None
    ) -> tuple[Params, Any]:
        factor = hyperparam_at(self.learning_rate, getattr(state, "count", None))
        if self.flip_sign:
            factor = -factor
        return by_group(lambda u: (times(u, factor),), updates)[0], _next(state)


def scale_by_learning_rate(
    learning_rate: HParam, *, flip_sign: bool = True
) -> GradientTransformation:
    """Multiply the updates by ``-learning_rate`` (descent), optax's ``scale_by_learning_rate``.

    ``u -> -lr_t * u`` with ``lr_t`` the learning rate or the schedule's value at this
    transformation's step count (a tensor: no host sync, no recompilation).

    Args:
        learning_rate: ``>= 0``, or a schedule (``count -> 0-d tensor``).
        flip_sign: negate (gradient descent); ``False`` scales by ``+lr``.

    Returns:
        A :class:`GradientTransformation` with state :class:`ScaleByScheduleState` for a
        schedule, else :class:`EmptyState`.

    Raises:
        TypeError: if ``learning_rate`` is neither a float nor a callable.
        ValueError: if a float ``learning_rate`` is negative.

    Example:
        >>> from sbfunc import optim
        >>> opt = optim.scale_by_learning_rate(0.5)
        >>> opt.update({"w": torch.ones(2)}, opt.init({"w": torch.ones(2)}))[0]
        {'w': tensor([-0.5000, -0.5000])}

    References:
        DeepMind optax ``scale_by_learning_rate``.
    """
    lr = check_real_or_schedule(learning_rate, "learning_rate")
    flip = check_bool(flip_sign, "flip_sign")
    return _ScaleByLearningRate(
        name="scale_by_learning_rate", learning_rate=lr, flip_sign=flip
    ).transformation()


@dataclasses.dataclass(frozen=True, repr=False)
class _AddDecayedWeights(TransformRecord):
    weight_decay: HParam

    def init(self, params: Params) -> Any:
        return _count_state(self.weight_decay)(params)

    def update(
        self, updates: Params, state: Any, params: Params | None = None
    ) -> tuple[Params, Any]:
        p = need_params(params, "add_decayed_weights")
        wd = hyperparam_at(self.weight_decay, getattr(state, "count", None))
        return by_group(lambda u, x: (_plus(u, x, wd),), updates, p)[0], _next(state)


def add_decayed_weights(
    weight_decay: HParam, *, mask: Mask | None = None
) -> GradientTransformation:
    """Add ``weight_decay * params`` to the updates: L2 weight decay coupled to the gradient.

    ``u -> u + wd_t * p``, one fused foreach ``add`` as ``torch.optim.SGD``/``Adam`` add their
    L2 term; before a moment estimate (:func:`trace`, :func:`scale_by_adam`) the decay runs
    through it, as in torch. With ``mask``, only the selected parameters are decayed (the
    usual no-decay group: biases and normalization weights), as ``masked(decay, mask)``.

    Args:
        weight_decay: ``>= 0``, or a schedule.
        mask: ``None`` (decay every parameter), or ``{name: bool}`` / a function of the
            parameters returning one (``True``: decayed), as in :func:`masked`.

    Returns:
        A :class:`GradientTransformation` with state :class:`ScaleByScheduleState` for a
        schedule, else :class:`EmptyState` (with ``mask``: :class:`MaskedState` around it).
        ``update`` needs ``params``.

    Raises:
        TypeError: if ``weight_decay`` is neither a float nor a callable, or ``mask`` is
            neither a mapping nor a callable.
        ValueError: if a float ``weight_decay`` is negative.

    Example:
        >>> from sbfunc import optim
        >>> opt, params = optim.add_decayed_weights(0.1), {"w": torch.tensor([2.0])}
        >>> opt.update({"w": torch.tensor([1.0])}, opt.init(params), params)[0]
        {'w': tensor([1.2000])}
        >>> params = {"w": torch.tensor([[2.0]]), "b": torch.tensor([2.0])}
        >>> no_bias = optim.add_decayed_weights(0.1, mask={"w": True, "b": False})
        >>> grads = {"w": torch.ones(1, 1), "b": torch.ones(1)}
        >>> no_bias.update(grads, no_bias.init(params), params)[0]
        {'w': tensor([[1.2000]]), 'b': tensor([1.])}

    References:
        DeepMind optax ``add_decayed_weights``; PyTorch ``torch.optim.SGD`` (``weight_decay``).
    """
    wd = check_real_or_schedule(weight_decay, "weight_decay")
    decay = _AddDecayedWeights(name="add_decayed_weights", weight_decay=wd).transformation()
    return decay if mask is None else masked(decay, mask)


@dataclasses.dataclass(frozen=True, repr=False)
class _DecoupledWeightDecay(TransformRecord):
    weight_decay: HParam
    learning_rate: HParam = 1.0
    initial_lr: float = 1.0

    def init(self, params: Params) -> Any:
        return _count_state(self.weight_decay, self.learning_rate)(params)

    def update(
        self, updates: Params, state: Any, params: Params | None = None
    ) -> tuple[Params, Any]:
        p = need_params(params, "decoupled_weight_decay")
        count = getattr(state, "count", None)
        lr = hyperparam_at(self.learning_rate, count)
        wd = hyperparam_at(self.weight_decay, count)
        factor = 1 - (lr / self.initial_lr) * wd  # torch's and Composer's parameter factor

        def decay(u: list[torch.Tensor], x: list[torch.Tensor]) -> tuple[list[torch.Tensor]]:
            # factor * p - p is exact (Sterbenz) for factor in [1/2, 2], so p + out rounds
            # only where torch's (factor * p) + u does
            out = times(x, factor)
            torch._foreach_sub_(out, x)
            torch._foreach_add_(out, u)
            return (out,)

        return by_group(decay, updates, p)[0], _next(state)


def decoupled_weight_decay(
    weight_decay: HParam, *, learning_rate: HParam = 1.0, initial_lr: float = 1.0
) -> GradientTransformation:
    """Decay the parameters apart from the gradient: applied, the updates multiply the
    parameters by ``1 - (lr_t / initial_lr) * wd_t``.

    ``u -> u + (c_t * p - p)`` with ``c_t = 1 - (lr_t / initial_lr) * wd_t``: torch's
    ``AdamW`` (``initial_lr=1``, the decay scales with the learning rate) and Composer's
    ``DecoupledSGDW``/``DecoupledAdamW`` (``initial_lr`` the base learning rate: the decay per
    step follows the schedule's shape, not its value). ``c_t * p - p`` is computed with
    torch's factor and is exact for ``c_t`` in ``[1/2, 2]``.

    Args:
        weight_decay: ``>= 0``, or a schedule.
        learning_rate: ``>= 0``, or a schedule (the optimizer's learning rate).
        initial_lr: the reference learning rate, ``> 0``.

    Returns:
        A :class:`GradientTransformation` with state :class:`ScaleByScheduleState` when a
        hyperparameter is a schedule, else :class:`EmptyState`. ``update`` needs ``params``.

    Raises:
        TypeError: for arguments of the wrong type.
        ValueError: for out-of-range values.

    Example:
        >>> from sbfunc import optim
        >>> opt, params = optim.decoupled_weight_decay(0.25), {"w": torch.tensor([2.0])}
        >>> opt.update({"w": torch.tensor([0.0])}, opt.init(params), params)[0]
        {'w': tensor([-0.5000])}

    References:
        Loshchilov and Hutter 2019, "Decoupled Weight Decay Regularization"; PyTorch
        ``torch.optim.AdamW``; MosaicML Composer ``DecoupledSGDW``/``DecoupledAdamW``.
    """
    return _DecoupledWeightDecay(
        name="decoupled_weight_decay",
        weight_decay=check_real_or_schedule(weight_decay, "weight_decay"),
        learning_rate=check_real_or_schedule(learning_rate, "learning_rate"),
        initial_lr=check_real(initial_lr, "initial_lr", low=0.0, open_low=True),
    ).transformation()


def check_initial_lr(initial_lr: float | None, lr: HParam) -> float:
    """The reference learning rate of Composer's decoupled weight decay: ``initial_lr`` when
    given (``> 0``), else a float ``lr`` itself, else the schedule's value at step 0, which must
    then be ``> 0`` (a zero ``lr`` or a warm-up from 0 needs an explicit ``initial_lr``, such as
    the peak; Composer would then decay by the full ``weight_decay`` at every step)."""
    if initial_lr is not None:
        return check_real(initial_lr, "initial_lr", low=0.0, open_low=True)
    if callable(lr):
        first = float(value_at(lr, torch.zeros((), dtype=torch.int64)))  # once, at construction
        what = f"the lr schedule is {first!r} at step 0"
    else:
        first, what = lr, f"lr is {lr!r}"
    if not first > 0:
        raise ValueError(
            f"initial_lr is needed: {what}, and the decoupled weight decay scales by "
            "lr / initial_lr; pass initial_lr > 0 (Composer's base learning rate, e.g. the "
            "schedule's peak)"
        )
    return first
