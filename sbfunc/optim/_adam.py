"""Adam, AdamW (``torch.optim.Adam``/``AdamW``) and Composer's ``DecoupledAdamW`` as pure
updates."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import torch

from sbfunc.module import Params
from sbfunc.optim._base import (
    Hyperparams,
    Optimizer,
    Scalar,
    axpy,
    check_grads,
    check_initial_lr,
    decoupled_decay,
    groups,
    is_zero,
    on,
    resolve,
    zero_count,
)
from sbfunc.optim._checks import check_real_or_schedule
from sbfunc.validation import check_bool, check_real

__all__ = ["AdamState", "adam", "adamw", "decoupled_adamw"]

HParam = float | Callable[[Any], torch.Tensor]
_F64 = torch.float64


class AdamState(NamedTuple):
    """The state of :func:`adam`, :func:`adamw` and :func:`decoupled_adamw`.

    Attributes:
        count: 0-d int64 tensor, the steps taken, on the parameters' device.
        exp_avg: the first-moment estimates, keyed like the parameters.
        exp_avg_sq: the second-moment estimates, keyed like the parameters.
        max_exp_avg_sq: AMSGrad's running maxima of ``exp_avg_sq``; empty without
            ``amsgrad``.

    Example:
        >>> from sbfunc import optim
        >>> state = optim.adam(1e-3).init({"w": torch.ones(2)})
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
class _Adam(Hyperparams):
    lr: HParam
    b1: float
    b2: float
    eps: float
    weight_decay: HParam
    amsgrad: bool
    maximize: bool

    _l2: ClassVar[bool] = True  # weight decay as an L2 term in the gradient (torch's Adam)
    _lerp: ClassVar[bool] = True  # first moment by lerp (torch) or mul + add (Composer)

    def _decay(self, lr: Scalar, weight_decay: Scalar) -> Scalar | None:
        return None

    def init(self, params: Params) -> AdamState:
        def zeros() -> Params:
            return {k: torch.zeros_like(p) for k, p in params.items()}

        return AdamState(zero_count(params), zeros(), zeros(), zeros() if self.amsgrad else {})

    def update(self, grads: Params, state: AdamState, params: Params) -> tuple[Params, AdamState]:
        check_grads(grads, params)
        count = state.count
        lr, wd = resolve(self.lr, count), resolve(self.weight_decay, count)
        decay = self._decay(lr, wd)
        # torch.optim's bias corrections, in float64 as its Python floats are
        next_count = count + 1
        t = next_count.to(_F64)
        bc1 = 1 - torch.pow(self.b1, t)
        bc2_sqrt = (1 - torch.pow(self.b2, t)).sqrt()
        lr_t = lr if isinstance(lr, torch.Tensor) else torch.full_like(bc1, lr)
        neg_step = (lr_t / bc1).neg()
        new: tuple[Params, ...] = ({}, {}, {}, {})  # params, exp_avg, exp_avg_sq, max
        for keys in groups(params):
            like = params[keys[0]]
            results = self._step(
                [params[k] for k in keys],
                [grads[k] for k in keys],
                [state.exp_avg[k] for k in keys],
                [state.exp_avg_sq[k] for k in keys],
                [state.max_exp_avg_sq[k] for k in keys] if self.amsgrad else [],
                *(on(x, like) for x in (wd, decay, bc2_sqrt, neg_step)),
            )
            for d, r in zip(new, results, strict=True):
                d.update(zip(keys, r, strict=False))
        new_state = AdamState(
            next_count,
            *({k: d[k] for k in old} for d, old in zip(new[1:], state[1:], strict=True)),
        )
        return {k: new[0][k] for k in params}, new_state

    def _step(
        self,
        p: list[torch.Tensor],
        g: list[torch.Tensor],
        m: list[torch.Tensor],
        v: list[torch.Tensor],
        v_max: list[torch.Tensor],
        wd: Any,
        decay: Any,
        bc2_sqrt: Any,
        neg_step: Any,
    ) -> tuple[list[torch.Tensor], ...]:
        fresh = False  # whether `g` holds tensors allocated here (safe to update in place)
        if self.maximize:
            g, fresh = list(torch._foreach_neg(g)), True
        if self._l2 and not is_zero(wd):
            g = axpy(g, p, wd, inplace=fresh)
        if self._lerp:
            m = list(torch._foreach_lerp(m, g, 1 - self.b1))
        else:
            m = list(torch._foreach_mul(m, self.b1))
            torch._foreach_add_(m, g, alpha=1 - self.b1)
        v = list(torch._foreach_mul(v, self.b2))
        torch._foreach_addcmul_(v, g, g, value=1 - self.b2)
        if self.amsgrad:
            v_max = list(torch._foreach_maximum(v_max, v))
        denom = list(torch._foreach_sqrt(v_max if self.amsgrad else v))
        torch._foreach_div_(denom, bc2_sqrt)
        torch._foreach_add_(denom, self.eps)
        # -lr / bc1 * m first, then / denom: the rounding order of torch's addcdiv(value=...)
        step = torch._foreach_mul(m, neg_step)
        if decay is None:
            return list(torch._foreach_addcdiv(p, step, denom)), m, v, v_max
        new_p = list(torch._foreach_mul(p, decay))
        torch._foreach_addcdiv_(new_p, step, denom)
        return new_p, m, v, v_max


@dataclasses.dataclass(frozen=True, repr=False)
class _AdamW(_Adam):
    _l2: ClassVar[bool] = False

    def _decay(self, lr: Scalar, weight_decay: Scalar) -> Scalar | None:
        return None if is_zero(weight_decay) else 1 - lr * weight_decay


@dataclasses.dataclass(frozen=True, repr=False)
class _DecoupledAdamW(_Adam):
    initial_lr: float

    _l2: ClassVar[bool] = False
    _lerp: ClassVar[bool] = False

    def _decay(self, lr: Scalar, weight_decay: Scalar) -> Scalar | None:
        return decoupled_decay(lr, weight_decay, self.initial_lr)


def _check_adam(
    lr: Any, b1: Any, b2: Any, eps: Any, weight_decay: Any, amsgrad: Any, maximize: Any
) -> dict[str, Any]:
    return {
        "lr": check_real_or_schedule(lr, "lr", open_low=True),
        "b1": check_real(b1, "b1", low=0.0, high=1.0, open_high=True),
        "b2": check_real(b2, "b2", low=0.0, high=1.0, open_high=True),
        "eps": check_real(eps, "eps", low=0.0),
        "weight_decay": check_real_or_schedule(weight_decay, "weight_decay"),
        "amsgrad": check_bool(amsgrad, "amsgrad"),
        "maximize": check_bool(maximize, "maximize"),
    }


def adam(
    lr: HParam,
    *,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: HParam = 0.0,
    amsgrad: bool = False,
    maximize: bool = False,
) -> Optimizer:
    """Adam, exactly as ``torch.optim.Adam`` (weight decay as an L2 term in the gradient).

    Per step ``t`` (from 1), with ``g`` the gradient (negated when ``maximize``) plus
    ``weight_decay * p``: ``m = lerp(m, g, 1 - b1)``, ``v = b2 * v + (1 - b2) * g**2``
    (AMSGrad: ``v_max = max(v_max, v)`` is used below instead of ``v``),
    ``p += -lr / (1 - b1**t) * m / (sqrt(v) / sqrt(1 - b2**t) + eps)``. The bias corrections
    are 0-d float64 tensors computed from ``count`` (no host sync, no recompilation), each
    quantity is one foreach kernel over all parameters, and the inputs are never modified.

    Args:
        lr: the learning rate, ``> 0``, or a schedule (``count -> 0-d tensor``, evaluated
            inside ``update`` on the steps taken so far, like ``torch.optim.lr_scheduler``).
        b1: the decay of the first-moment average, in ``[0, 1)``.
        b2: the decay of the second-moment average, in ``[0, 1)``.
        eps: added to the denominator, ``>= 0``.
        weight_decay: the L2 penalty added to the gradient, ``>= 0``, or a schedule.
        amsgrad: use the running maximum of the second moment (AMSGrad).
        maximize: maximize the objective instead of minimizing it.

    Returns:
        An :class:`Optimizer` with state :class:`AdamState`.

    Raises:
        TypeError: for arguments of the wrong type.
        ValueError: for out-of-range values.

    Example:
        >>> from sbfunc import optim
        >>> opt = optim.adam(0.1)
        >>> params = {"w": torch.tensor([1.0, -1.0])}
        >>> params, state = opt.update({"w": torch.tensor([2.0, -3.0])}, opt.init(params), params)
        >>> params["w"]
        tensor([ 0.9000, -0.9000])

    References:
        Kingma and Ba 2015, "Adam: A Method for Stochastic Optimization"; Reddi et al. 2018,
        "On the Convergence of Adam and Beyond" (AMSGrad); PyTorch ``torch.optim.Adam``;
        DeepMind optax ``adam``.
    """
    args = _check_adam(lr, b1, b2, eps, weight_decay, amsgrad, maximize)
    opt = _Adam(name="adam", **args)
    return Optimizer(opt.init, opt.update)


def adamw(
    lr: HParam,
    *,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: HParam = 1e-2,
    amsgrad: bool = False,
    maximize: bool = False,
) -> Optimizer:
    """AdamW, exactly as ``torch.optim.AdamW``: Adam with decoupled weight decay.

    Each step first multiplies the parameters by ``1 - lr_t * weight_decay``, then takes the
    :func:`adam` step without the L2 term.

    Args:
        lr: as in :func:`adam`.
        b1: as in :func:`adam`.
        b2: as in :func:`adam`.
        eps: as in :func:`adam`.
        amsgrad: as in :func:`adam`.
        maximize: as in :func:`adam`.
        weight_decay: the decay per unit of learning rate, ``>= 0``, or a schedule.

    Returns:
        An :class:`Optimizer` with state :class:`AdamState`.

    Raises:
        TypeError: for arguments of the wrong type.
        ValueError: for out-of-range values.

    Example:
        >>> from sbfunc import optim
        >>> opt = optim.adamw(0.1, weight_decay=0.5)
        >>> params = {"w": torch.tensor([1.0, -1.0])}
        >>> params, state = opt.update({"w": torch.tensor([2.0, -3.0])}, opt.init(params), params)
        >>> params["w"]
        tensor([ 0.8500, -0.8500])

    References:
        Loshchilov and Hutter 2019, "Decoupled Weight Decay Regularization"; PyTorch
        ``torch.optim.AdamW``; DeepMind optax ``adamw``.
    """
    args = _check_adam(lr, b1, b2, eps, weight_decay, amsgrad, maximize)
    opt = _AdamW(name="adamw", **args)
    return Optimizer(opt.init, opt.update)


def decoupled_adamw(
    lr: HParam,
    *,
    b1: float = 0.9,
    b2: float = 0.95,
    eps: float = 1e-8,
    weight_decay: HParam = 1e-5,
    amsgrad: bool = False,
    maximize: bool = False,
    initial_lr: float | None = None,
) -> Optimizer:
    """Adam with weight decay decoupled from the learning rate, as Composer's
    ``DecoupledAdamW``.

    Each step first multiplies the parameters by ``1 - (lr_t / initial_lr) * weight_decay``,
    then takes the Adam step (first moment as ``b1 * m + (1 - b1) * g``, Composer's rounding
    order). Unlike ``torch.optim.AdamW`` (factor ``1 - lr_t * weight_decay``), the decay per
    step follows the learning-rate *schedule* but not the learning-rate *value*: with a
    constant ``lr`` each step multiplies the parameters by exactly ``1 - weight_decay``, so
    torch's ``weight_decay=w`` matches ``weight_decay=lr * w`` here. Defaults are Composer's
    (``b2=0.95``, ``weight_decay=1e-5``).

    Args:
        lr: as in :func:`adam`.
        b1: as in :func:`adam`.
        b2: as in :func:`adam`.
        eps: as in :func:`adam`.
        amsgrad: as in :func:`adam`.
        weight_decay: the decay per step at ``lr_t == initial_lr``, ``>= 0``, or a schedule.
        maximize: maximize the objective (an sbfunc extension; Composer has none).
        initial_lr: Composer's base learning rate, ``> 0``; defaults to ``lr`` (a float) or
            the schedule's value at step 0 (give it, e.g. the peak, for a warm-up from 0).

    Returns:
        An :class:`Optimizer` with state :class:`AdamState`.

    Raises:
        TypeError: for arguments of the wrong type.
        ValueError: for out-of-range values or no positive ``initial_lr``.

    Example:
        >>> from sbfunc import optim
        >>> opt = optim.decoupled_adamw(0.1, weight_decay=0.5)
        >>> params = {"w": torch.tensor([1.0, -1.0])}
        >>> params, state = opt.update({"w": torch.tensor([2.0, -3.0])}, opt.init(params), params)
        >>> params["w"]
        tensor([ 0.4000, -0.4000])

    References:
        MosaicML Composer ``composer.optim.DecoupledAdamW``; Loshchilov and Hutter 2019,
        "Decoupled Weight Decay Regularization"; PyTorch ``torch.optim.AdamW``.
    """
    args = _check_adam(lr, b1, b2, eps, weight_decay, amsgrad, maximize)
    start = check_initial_lr(initial_lr, args["lr"])
    opt = _DecoupledAdamW(name="decoupled_adamw", initial_lr=start, **args)
    return Optimizer(opt.init, opt.update)
