"""The transformations with moment estimates: SGD's momentum (:func:`trace`) and Adam's first
and second moments (:func:`scale_by_adam`), on torch.optim's foreach kernels and rounding."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import torch

from sbfunc._tracing import host_readable
from sbfunc.optim._base import (
    HIDDEN_UNSET,
    GradientTransformation,
    Scalar,
    TransformRecord,
    by_group,
    cast_like,
    kept_in,
    narrowed,
    scalar_like,
    widened,
    zero_count,
)
from sbfunc.optim._checks import check_dtype, check_real_or_schedule
from sbfunc.optim._schedules import value_at
from sbfunc.optim._transforms import HParam
from sbfunc.types import Params
from sbfunc.validation import check_bool, check_real

__all__ = [
    "ScaleByAdamState",
    "TraceState",
    "check_momentum",
    "on_real_views",
    "scale_by_adam",
    "trace",
]

_F64 = torch.float64


class TraceState(NamedTuple):
    """The state of :func:`trace` (SGD's momentum).

    Attributes:
        count: 0-d int64 tensor, the updates made, on the parameters' device.
        momentum_buffer: the momentum buffers keyed like the parameters (zeros at ``init``).

    Example:
        >>> from sbfunc import optim
        >>> optim.trace(0.9).init({"w": torch.ones(2)})
        TraceState(count=tensor(0), momentum_buffer={'w': tensor([0., 0.])})

    References:
        PyTorch ``torch.optim.SGD`` (``state["momentum_buffer"]``); DeepMind optax
        ``TraceState``.
    """

    count: torch.Tensor  # type: ignore[assignment]  # (shadows tuple.count, as in optax)
    momentum_buffer: dict[str, torch.Tensor]


@dataclasses.dataclass(frozen=True, repr=False)
class _Trace(TransformRecord):
    momentum: float
    dampening: float = 0.0
    nesterov: bool = False
    accumulator_dtype: torch.dtype | None = dataclasses.field(default=None, metadata=HIDDEN_UNSET)

    def init(self, params: Params) -> TraceState:
        return TraceState(zero_count(params), kept_in(self.accumulator_dtype, params))

    def update(
        self, updates: Params, state: TraceState, params: Params | None = None
    ) -> tuple[Params, TraceState]:
        kept = self.accumulator_dtype
        if kept is None:
            updates = cast_like(updates, state.momentum_buffer)  # in the buffers' dtype
        updates, buffers = widened(kept, updates, state.momentum_buffer)
        first = None
        if self.dampening != 0:  # 1.0 at the first step, where torch copies the gradient
            first = (state.count == 0).to(_F64)

        def step(g: list[torch.Tensor], b: list[torch.Tensor]) -> tuple[list[torch.Tensor], ...]:
            new_b = list(torch._foreach_mul(b, self.momentum))
            torch._foreach_add_(new_b, g, alpha=1 - self.dampening)
            if first is not None:  # b * (1 - first) + g * first selects exactly (for finite
                # gradients; an infinite one turns the buffer NaN rather than inf)
                f = scalar_like(first, g[0])
                torch._foreach_mul_(new_b, 1 - f)  # type: ignore[operator]
                torch._foreach_add_(new_b, torch._foreach_mul(g, f))  # type: ignore[arg-type]
            if self.nesterov:
                return list(torch._foreach_add(g, new_b, alpha=self.momentum)), new_b
            return new_b, new_b

        out, buffers = by_group(step, updates, buffers, outputs=2)
        return out, TraceState(state.count + 1, narrowed(kept, buffers))


def check_momentum(momentum: object, dampening: object, nesterov: object) -> dict[str, object]:
    """The checked momentum arguments of :func:`trace` and the SGD optimizers."""
    args: dict[str, object] = {
        "momentum": check_real(momentum, "momentum", low=0.0),
        "dampening": check_real(dampening, "dampening", low=0.0, high=1.0),
        "nesterov": check_bool(nesterov, "nesterov"),
    }
    if args["nesterov"] and (args["momentum"] == 0 or args["dampening"] != 0):
        raise ValueError(
            "nesterov=True needs momentum > 0 and dampening == 0 (torch.optim.SGD's rule), "
            f"got momentum={args['momentum']!r}, dampening={args['dampening']!r}"
        )
    return args


def trace(
    momentum: float,
    *,
    dampening: float = 0.0,
    nesterov: bool = False,
    accumulator_dtype: torch.dtype | None = None,
) -> GradientTransformation:
    """SGD's momentum, exactly as ``torch.optim.SGD`` keeps it.

    ``b = g`` at the first update, then ``b = momentum * b + (1 - dampening) * g``; the update
    is ``g + momentum * b`` (Nesterov) or ``b``. With ``dampening=0`` this is optax's
    ``trace``. Gradients of another dtype are cast to the buffers' (the parameters') dtype.
    With ``accumulator_dtype`` (optax's), the buffers are kept in that dtype: each update is
    computed in the wider of it and the gradient's dtype, and only the stored buffer is
    rounded to it (``torch.bfloat16`` halves the buffers' memory of float32 parameters).

    Args:
        momentum: the momentum factor, ``>= 0``.
        dampening: the dampening of the momentum, in ``[0, 1]``.
        nesterov: Nesterov momentum (needs ``momentum > 0`` and ``dampening == 0``).
        accumulator_dtype: ``None`` (the parameters' dtype) or the floating dtype the
            momentum buffers are kept in.

    Returns:
        A :class:`GradientTransformation` with state :class:`TraceState`.

    Raises:
        TypeError: for arguments of the wrong type.
        ValueError: for out-of-range values or Nesterov without momentum or with dampening.

    Example:
        >>> from sbfunc import optim
        >>> opt = optim.trace(0.5)
        >>> state = opt.init({"w": torch.zeros(1)})
        >>> for _ in range(2):
        ...     updates, state = opt.update({"w": torch.ones(1)}, state)
        >>> updates
        {'w': tensor([1.5000])}

    References:
        PyTorch ``torch.optim.SGD`` (its first-step buffer rule); Sutskever et al. 2013, "On
        the importance of initialization and momentum in deep learning"; DeepMind optax
        ``trace``.
    """
    args = check_momentum(momentum, dampening, nesterov)
    kept = check_dtype(accumulator_dtype, "accumulator_dtype")
    return _Trace(name="trace", **args, accumulator_dtype=kept).transformation()  # type: ignore[arg-type]


Lists = list[torch.Tensor]


def on_real_views(fn: Callable[..., tuple[Lists, ...]]) -> Callable[..., tuple[Lists, ...]]:
    """``fn`` on lists of one dtype; complex tensors go in as real ``(..., 2)`` views and come
    out viewed as complex again: ``torch.optim.Adam``'s ``view_as_real``, so the second moment
    adds ``re**2`` and ``im**2`` (``|g|**2`` in all), not the complex ``g * g``, and AMSGrad's
    maximum (no complex kernel) runs on the parts."""

    def run(*lists: Lists) -> tuple[Lists, ...]:
        if not lists[0] or not lists[0][0].is_complex():
            return fn(*lists)
        outs = fn(*([torch.view_as_real(t) for t in ts] for ts in lists))
        return tuple([torch.view_as_complex(t) for t in ts] for ts in outs)

    return run


class ScaleByAdamState(NamedTuple):
    """The state of :func:`scale_by_adam` (and of :func:`adam`, :func:`adamw`,
    :func:`decoupled_adamw` without ``maximize`` or a weight decay before the moments).

    Attributes:
        count: 0-d int64 tensor, the updates made, on the parameters' device.
        exp_avg: the first-moment estimates, keyed like the parameters.
        exp_avg_sq: the second-moment estimates, keyed like the parameters.
        max_exp_avg_sq: AMSGrad's running maxima of ``exp_avg_sq``; empty without
            ``amsgrad``.

    Example:
        >>> from sbfunc import optim
        >>> state = optim.scale_by_adam().init({"w": torch.ones(2)})
        >>> state.count, state.exp_avg, state.max_exp_avg_sq
        (tensor(0), {'w': tensor([0., 0.])}, {})

    References:
        PyTorch ``torch.optim.Adam`` (its per-parameter state keys); DeepMind optax
        ``ScaleByAdamState``.
    """

    count: torch.Tensor  # type: ignore[assignment]  # (shadows tuple.count, as in optax)
    exp_avg: dict[str, torch.Tensor]
    exp_avg_sq: dict[str, torch.Tensor]
    max_exp_avg_sq: dict[str, torch.Tensor]


@dataclasses.dataclass(frozen=True, repr=False)
class ScaleByAdamRecord(TransformRecord):
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    amsgrad: bool = False
    learning_rate: HParam | None = None
    lerp: bool = dataclasses.field(default=True, repr=False)  # torch's lerp, or Composer's
    # mul + add, for the first moment
    mu_dtype: torch.dtype | None = dataclasses.field(default=None, metadata=HIDDEN_UNSET)

    def init(self, params: Params) -> ScaleByAdamState:
        if self.mu_dtype is not None and any(p.is_complex() for p in params.values()):
            raise TypeError("mu_dtype is for real parameters; leave it None for complex ones")
        return ScaleByAdamState(
            zero_count(params),
            kept_in(self.mu_dtype, params),
            kept_in(None, params),
            kept_in(None, params) if self.amsgrad else {},
        )

    def scalars(self, count: torch.Tensor) -> tuple[Scalar, Scalar]:
        """``(step, sqrt(1 - b2**t))`` of update ``t = count + 1``: ``step`` is
        ``1 / (1 - b1**t)``, or ``-lr_t / (1 - b1**t)`` with a learning rate."""
        lr = self.learning_rate
        if host_readable(count) and not callable(lr):
            # eagerly on the CPU, torch.optim's own arithmetic: Python floats from the count
            t = int(count) + 1
            bc1 = 1 - self.b1**t
            return (1 / bc1 if lr is None else (lr / bc1) * -1), (1 - self.b2**t) ** 0.5
        # the same in 0-d float64 tensors: no host sync, no recompilation
        t64 = (count + 1).to(_F64)
        bc1_t = 1 - torch.pow(self.b1, t64)
        bc2_sqrt = (1 - torch.pow(self.b2, t64)).sqrt()
        if lr is None:
            return bc1_t.reciprocal(), bc2_sqrt
        lr_t = value_at(lr, count) if callable(lr) else torch.full_like(bc1_t, lr)
        return (lr_t / bc1_t).neg(), bc2_sqrt

    def update(
        self, updates: Params, state: ScaleByAdamState, params: Params | None = None
    ) -> tuple[Params, ScaleByAdamState]:
        updates = cast_like(updates, state.exp_avg_sq)  # computed in the moments' dtype
        step, bc2_sqrt = self.scalars(state.count)
        v_max = state.max_exp_avg_sq if self.amsgrad else state.exp_avg_sq  # (unused without)
        widen = widened(self.mu_dtype, updates, state.exp_avg, state.exp_avg_sq, v_max)

        @on_real_views
        def moments(g: Lists, m: Lists, v: Lists, v_max: Lists) -> tuple[Lists, ...]:
            if self.lerp:
                m = list(torch._foreach_lerp(m, g, 1 - self.b1))
            else:
                m = list(torch._foreach_mul(m, self.b1))
                torch._foreach_add_(m, g, alpha=1 - self.b1)
            v = list(torch._foreach_mul(v, self.b2))
            torch._foreach_addcmul_(v, g, g, value=1 - self.b2)
            if self.amsgrad:
                v_max = list(torch._foreach_maximum(v_max, v))
            denom = list(torch._foreach_sqrt(v_max if self.amsgrad else v))
            torch._foreach_div_(denom, scalar_like(bc2_sqrt, g[0]))  # type: ignore[arg-type]
            torch._foreach_add_(denom, self.eps)
            # step * m first, then / denom: the rounding of torch's addcdiv(value=step), whose
            # p + this is exact as torch's
            out = list(torch._foreach_mul(m, scalar_like(step, g[0])))  # type: ignore[arg-type]
            torch._foreach_div_(out, denom)
            return out, m, v, v_max

        out, m, v, v_max = by_group(moments, *widen, outputs=4)
        if self.mu_dtype is not None:  # only the stored moments are rounded
            m, v, v_max = (
                narrowed(self.mu_dtype, m),
                cast_like(v, updates),
                cast_like(v_max, updates),
            )
        return out, ScaleByAdamState(state.count + 1, m, v, v_max if self.amsgrad else {})


def check_adam(
    b1: object, b2: object, eps: object, amsgrad: object, mu_dtype: object = None
) -> dict[str, object]:
    """The checked moment arguments of :func:`scale_by_adam` and the Adam optimizers."""
    return {
        "b1": check_real(b1, "b1", low=0.0, high=1.0, open_high=True),
        "b2": check_real(b2, "b2", low=0.0, high=1.0, open_high=True),
        "eps": check_real(eps, "eps", low=0.0),
        "amsgrad": check_bool(amsgrad, "amsgrad"),
        "mu_dtype": check_dtype(mu_dtype, "mu_dtype"),
    }


def scale_by_adam(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    *,
    amsgrad: bool = False,
    learning_rate: HParam | None = None,
    mu_dtype: torch.dtype | None = None,
) -> GradientTransformation:
    """Adam's rescaling of the gradient, exactly as ``torch.optim.Adam`` computes it.

    Per update ``t`` (from 1): ``m = lerp(m, g, 1 - b1)``, ``v = b2 * v + (1 - b2) * g**2``
    (AMSGrad: ``v_max = max(v_max, v)`` is used below instead of ``v``), and the update is
    ``s / (1 - b1**t) * m / (sqrt(v) / sqrt(1 - b2**t) + eps)`` with ``s = 1``, or with
    ``s = -lr_t`` when ``learning_rate`` is given: the learning rate then enters before the
    division, in torch's rounding order, so ``params + update`` equals torch's
    ``addcdiv_`` bit for bit (a separate :func:`scale_by_learning_rate` would round once more).
    The bias corrections are 0-d float64 tensors computed from ``count``. Complex tensors are
    viewed as real pairs (torch's ``view_as_real``): ``g**2`` is taken part by part, so the
    step scales with ``|g|``; gradients of another dtype are cast to the moments' (the
    parameters') dtype.

    Args:
        b1: the decay of the first-moment average, in ``[0, 1)``.
        b2: the decay of the second-moment average, in ``[0, 1)``.
        eps: added to the denominator, ``>= 0``.
        amsgrad: use the running maximum of the second moment (AMSGrad).
        learning_rate: ``None`` (no learning rate, no negation), or ``>= 0`` or a schedule:
            the update is then the descent step itself.
        mu_dtype: ``None`` (the parameters' dtype) or the floating dtype the first moment is
            kept in (optax's): the step is computed in the wider of it and the parameters'
            dtype, and only the stored ``exp_avg`` is rounded to it.

    Returns:
        A :class:`GradientTransformation` with state :class:`ScaleByAdamState`.

    Raises:
        TypeError: for arguments of the wrong type.
        ValueError: for out-of-range values.

    Example:
        >>> from sbfunc import optim
        >>> opt = optim.scale_by_adam()
        >>> opt.update({"w": torch.tensor([2.0, -3.0])}, opt.init({"w": torch.zeros(2)}))[0]
        {'w': tensor([ 1., -1.])}

    References:
        Kingma and Ba 2015, "Adam: A Method for Stochastic Optimization"; Reddi et al. 2018,
        "On the Convergence of Adam and Beyond" (AMSGrad); PyTorch ``torch.optim.Adam``;
        DeepMind optax ``scale_by_adam``.
    """
    args = check_adam(b1, b2, eps, amsgrad, mu_dtype)
    lr = None
    if learning_rate is not None:
        lr = check_real_or_schedule(learning_rate, "learning_rate")
    return ScaleByAdamRecord(name="scale_by_adam", learning_rate=lr, **args).transformation()  # type: ignore[arg-type]
