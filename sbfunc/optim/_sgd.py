"""SGD with momentum (``torch.optim.SGD``) and Composer's ``DecoupledSGDW`` as pure updates."""

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

__all__ = ["SGDState", "decoupled_sgdw", "sgd"]

HParam = float | Callable[[Any], torch.Tensor]


class SGDState(NamedTuple):
    """The state of :func:`sgd` and :func:`decoupled_sgdw`.

    Attributes:
        count: 0-d int64 tensor, the steps taken, on the parameters' device.
        momentum_buffer: the momentum buffers keyed like the parameters (zeros at ``init``);
            empty when ``momentum == 0``.

    Example:
        >>> from sbfunc import optim
        >>> optim.sgd(0.1, momentum=0.9).init({"w": torch.ones(2)})
        SGDState(count=tensor(0), momentum_buffer={'w': tensor([0., 0.])})

    References:
        PyTorch ``torch.optim.SGD`` (``state["momentum_buffer"]``); DeepMind optax
        ``TraceState``.
    """

    count: torch.Tensor  # type: ignore[assignment]  # (shadows tuple.count, as in optax)
    momentum_buffer: dict[str, torch.Tensor]


@dataclasses.dataclass(frozen=True, repr=False)
class _SGD(Hyperparams):
    lr: HParam
    momentum: float
    dampening: float
    nesterov: bool
    weight_decay: HParam
    maximize: bool

    _l2: ClassVar[bool] = True  # weight decay as an L2 term in the gradient (torch's SGD)

    def _decay(self, lr: Scalar, weight_decay: Scalar) -> Scalar | None:
        return None

    def init(self, params: Params) -> SGDState:
        buffers = {k: torch.zeros_like(p) for k, p in params.items()} if self.momentum else {}
        return SGDState(zero_count(params), buffers)

    def update(self, grads: Params, state: SGDState, params: Params) -> tuple[Params, SGDState]:
        check_grads(grads, params)
        count = state.count
        lr, wd = resolve(self.lr, count), resolve(self.weight_decay, count)
        decay = self._decay(lr, wd)
        first = None
        if self.momentum != 0 and self.dampening != 0:
            # 1.0 at the first step, where torch.optim.SGD copies the gradient undampened
            first = (count == 0).to(torch.float64)
        new_params: Params = {}
        new_buffers: Params = {}
        for keys in groups(params):
            like = params[keys[0]]
            p, g = [params[k] for k in keys], [grads[k] for k in keys]
            b = [state.momentum_buffer[k] for k in keys] if self.momentum else []
            out_p, out_b = self._step(
                p, g, b, on(lr, like), on(wd, like), on(first, like), on(decay, like)
            )
            new_params.update(zip(keys, out_p, strict=True))
            new_buffers.update(zip(keys, out_b, strict=False))
        buffers = {k: new_buffers[k] for k in state.momentum_buffer}
        return {k: new_params[k] for k in params}, SGDState(count + 1, buffers)

    def _step(
        self,
        p: list[torch.Tensor],
        g: list[torch.Tensor],
        b: list[torch.Tensor],
        lr: Any,
        wd: Any,
        first: Any,
        decay: Any,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        fresh = False  # whether `g` holds tensors allocated here (safe to update in place)
        if self.maximize:
            g, fresh = list(torch._foreach_neg(g)), True
        if self._l2 and not is_zero(wd):
            g, fresh = axpy(g, p, wd, inplace=fresh), True
        new_b: list[torch.Tensor] = []
        if self.momentum != 0:
            new_b = list(torch._foreach_mul(b, self.momentum))
            torch._foreach_add_(new_b, g, alpha=1 - self.dampening)
            if first is not None:  # b * (1 - first) + g * first selects exactly (for finite
                # gradients; an infinite one turns the buffer NaN rather than inf)
                torch._foreach_mul_(new_b, 1 - first)
                torch._foreach_add_(new_b, torch._foreach_mul(g, first))
            g = axpy(g, new_b, self.momentum, inplace=fresh) if self.nesterov else new_b
        if decay is None:
            return axpy(p, g, -lr, inplace=False), new_b
        return axpy(list(torch._foreach_mul(p, decay)), g, -lr, inplace=True), new_b


@dataclasses.dataclass(frozen=True, repr=False)
class _DecoupledSGDW(_SGD):
    initial_lr: float

    _l2: ClassVar[bool] = False

    def _decay(self, lr: Scalar, weight_decay: Scalar) -> Scalar | None:
        return decoupled_decay(lr, weight_decay, self.initial_lr)


def _check_sgd(
    lr: Any, momentum: Any, dampening: Any, nesterov: Any, weight_decay: Any, maximize: Any
) -> dict[str, Any]:
    args = {
        "lr": check_real_or_schedule(lr, "lr", open_low=True),
        "momentum": check_real(momentum, "momentum", low=0.0),
        "dampening": check_real(dampening, "dampening", low=0.0, high=1.0),
        "nesterov": check_bool(nesterov, "nesterov"),
        "weight_decay": check_real_or_schedule(weight_decay, "weight_decay"),
        "maximize": check_bool(maximize, "maximize"),
    }
    if nesterov and (args["momentum"] == 0 or args["dampening"] != 0):
        raise ValueError(
            "nesterov=True needs momentum > 0 and dampening == 0 (torch.optim.SGD's rule), "
            f"got momentum={args['momentum']!r}, dampening={args['dampening']!r}"
        )
    return args


def sgd(
    lr: HParam,
    *,
    momentum: float = 0.0,
    dampening: float = 0.0,
    nesterov: bool = False,
    weight_decay: HParam = 0.0,
    maximize: bool = False,
) -> Optimizer:
    """Stochastic gradient descent with momentum, exactly as ``torch.optim.SGD``.

    Per step, with ``g`` the gradient (negated when ``maximize``):
    ``g += weight_decay * p``; ``b = g`` on the first step, else
    ``b = momentum * b + (1 - dampening) * g``; ``g = g + momentum * b`` (Nesterov) or
    ``g = b``; ``p -= lr * g``. Every quantity is one foreach kernel over all parameters
    (per device and dtype), nothing syncs with the host, and the inputs are never modified.

    Args:
        lr: the learning rate, ``> 0``, or a schedule (``count -> 0-d tensor``, evaluated
            inside ``update`` on the steps taken so far, like ``torch.optim.lr_scheduler``).
        momentum: the momentum factor, ``>= 0``.
        dampening: the dampening of the momentum, in ``[0, 1]``.
        nesterov: Nesterov momentum (needs ``momentum > 0`` and ``dampening == 0``).
        weight_decay: the L2 penalty added to the gradient, ``>= 0``, or a schedule.
        maximize: maximize the objective instead of minimizing it.

    Returns:
        An :class:`Optimizer` with state :class:`SGDState`.

    Raises:
        TypeError: for arguments of the wrong type.
        ValueError: for out-of-range values or Nesterov without momentum or with dampening.

    Example:
        >>> from sbfunc import optim
        >>> opt = optim.sgd(0.1, momentum=0.9)
        >>> params = {"w": torch.tensor([1.0, 2.0])}
        >>> state = opt.init(params)
        >>> for _ in range(2):
        ...     params, state = opt.update({"w": torch.ones(2)}, state, params)
        >>> params["w"]
        tensor([0.7100, 1.7100])

    References:
        PyTorch ``torch.optim.SGD`` (its foreach implementation and first-step buffer rule);
        Sutskever et al. 2013, "On the importance of initialization and momentum in deep
        learning"; DeepMind optax ``sgd``.
    """
    args = _check_sgd(lr, momentum, dampening, nesterov, weight_decay, maximize)
    opt = _SGD(name="sgd", **args)
    return Optimizer(opt.init, opt.update)


def decoupled_sgdw(
    lr: HParam,
    *,
    momentum: float = 0.0,
    dampening: float = 0.0,
    nesterov: bool = False,
    weight_decay: HParam = 0.0,
    maximize: bool = False,
    initial_lr: float | None = None,
) -> Optimizer:
    """SGD with weight decay decoupled from the gradient, as Composer's ``DecoupledSGDW``.

    The momentum runs on the raw gradient (as :func:`sgd` with ``weight_decay=0``), and each
    step first multiplies the parameters by ``1 - (lr_t / initial_lr) * weight_decay``, then
    takes the SGD step ``p -= lr_t * g``. Unlike ``torch.optim.SGD`` (where the decay is an L2
    term ``weight_decay * p`` in the gradient, scaled by ``lr`` and fed through the momentum),
    the decay here bypasses the momentum and its per-step size follows the learning-rate
    *schedule* but not the learning-rate *value*: with a constant ``lr``, each step multiplies
    the parameters by exactly ``1 - weight_decay`` (without momentum, torch's
    ``weight_decay=w`` decays like ``weight_decay=lr * w`` here).

    Args:
        lr: the learning rate, ``> 0``, or a schedule.
        momentum: the momentum factor, ``>= 0``.
        dampening: the dampening of the momentum, in ``[0, 1]``.
        nesterov: Nesterov momentum (needs ``momentum > 0`` and ``dampening == 0``).
        weight_decay: the decoupled decay per step at ``lr_t == initial_lr``, ``>= 0``, or a
            schedule.
        maximize: maximize the objective (an sbfunc extension; Composer has none).
        initial_lr: Composer's base learning rate, ``> 0``; defaults to ``lr`` (a float) or
            the schedule's value at step 0 (give it, e.g. the peak, for a warm-up from 0).

    Returns:
        An :class:`Optimizer` with state :class:`SGDState`.

    Raises:
        TypeError: for arguments of the wrong type.
        ValueError: for out-of-range values, Nesterov without momentum or with dampening, or
            no positive ``initial_lr``.

    Example:
        >>> from sbfunc import optim
        >>> opt = optim.decoupled_sgdw(0.1, weight_decay=0.5)
        >>> params = {"w": torch.tensor([1.0, 2.0])}
        >>> params, _ = opt.update({"w": torch.zeros(2)}, opt.init(params), params)
        >>> params["w"]
        tensor([0.5000, 1.0000])

    References:
        MosaicML Composer ``composer.optim.DecoupledSGDW``; Loshchilov and Hutter 2019,
        "Decoupled Weight Decay Regularization"; PyTorch ``torch.optim.SGD``.
    """
    args = _check_sgd(lr, momentum, dampening, nesterov, weight_decay, maximize)
    start = check_initial_lr(initial_lr, args["lr"])
    opt = _DecoupledSGDW(name="decoupled_sgdw", initial_lr=start, **args)
    return Optimizer(opt.init, opt.update)
