"""SGD with momentum (``torch.optim.SGD``) and Composer's ``DecoupledSGDW`` as chains of
gradient transformations."""

from __future__ import annotations

from typing import Any

import torch

from sbfunc.optim._base import GradientTransformation, is_zero, optimizer_of
from sbfunc.optim._checks import (
    call_repr,
    check_dtype,
    check_real_or_schedule,
    learning_rate_of,
)
from sbfunc.optim._moments import check_momentum, trace
from sbfunc.optim._transforms import (
    HParam,
    add_decayed_weights,
    check_initial_lr,
    decoupled_weight_decay,
    scale,
    scale_by_learning_rate,
)
from sbfunc.validation import check_bool

__all__ = ["decoupled_sgdw", "sgd"]


def _check_sgd(
    name: str,
    lr: HParam | None,
    learning_rate: HParam | None,
    momentum: float,
    dampening: float,
    nesterov: bool,
    weight_decay: HParam,
    maximize: bool,
    accumulator_dtype: torch.dtype | None,
) -> dict[str, Any]:
    """The checked arguments of an SGD optimizer, in the order of its repr;
    ``accumulator_dtype`` only when set. Given one by one, not as ``locals()``:
    ``inject_hyperparams`` builds the optimizer inside the (compiled) update, and torch 2.11's
    dynamo cannot trace ``locals()``."""
    rate = learning_rate_of(name, lr, learning_rate)
    args = {
        "lr": check_real_or_schedule(rate, "lr" if lr is not None else "learning_rate"),
        **check_momentum(momentum, dampening, nesterov),
        "weight_decay": check_real_or_schedule(weight_decay, "weight_decay"),
        "maximize": check_bool(maximize, "maximize"),
    }
    kept = check_dtype(accumulator_dtype, "accumulator_dtype")
    if kept is not None:
        args["accumulator_dtype"] = kept
    return args


def _head(args: dict[str, Any], *, l2: bool) -> list[GradientTransformation]:
    """The parts before the learning rate: negation, L2 decay (``l2``), momentum."""
    parts = [scale(-1.0)] if args["maximize"] else []
    if l2 and not is_zero(args["weight_decay"]):
        parts.append(add_decayed_weights(args["weight_decay"]))
    if args["momentum"] != 0:
        momentum = trace(
            args["momentum"],
            dampening=args["dampening"],
            nesterov=args["nesterov"],
            accumulator_dtype=args.get("accumulator_dtype"),
        )
        parts.append(momentum)
    return parts


def sgd(
    lr: HParam | None = None,
    *,
    learning_rate: HParam | None = None,
    momentum: float = 0.0,
    dampening: float = 0.0,
    nesterov: bool = False,
    weight_decay: HParam = 0.0,
    maximize: bool = False,
    accumulator_dtype: torch.dtype | None = None,
) -> GradientTransformation:
    """Stochastic gradient descent with momentum, as ``torch.optim.SGD``.

    Per step, with ``g`` the gradient (negated when ``maximize``):
    ``g += weight_decay * p``; ``b = g`` on the first step, else
    ``b = momentum * b + (1 - dampening) * g``; ``g = g + momentum * b`` (Nesterov) or
    ``g = b``; the update is ``-lr * g``. Every quantity is one foreach kernel over all
    parameters (per device and dtype), nothing syncs with the host, and the inputs are never
    modified. The momentum buffers follow torch's bit for bit; ``apply_updates(p, -lr * g)``
    rounds twice where torch's fused ``p.add_(g, alpha=-lr)`` rounds once (as torch's own
    compiled path, which also multiplies first), so the parameters differ by about 1 ulp per
    step. Gradients of another dtype than the parameters are cast to the parameters' dtype
    (that of the momentum buffers and of the updates).

    Args:
        lr: the learning rate, ``>= 0`` (as torch.optim and optax: 0 updates by zeros), or a
            schedule (``count -> 0-d tensor``, evaluated inside ``update`` on the steps taken
            so far, like ``torch.optim.lr_scheduler``).
        learning_rate: ``lr`` in optax's spelling; give one of the two.
        momentum: the momentum factor, ``>= 0``.
        dampening: the dampening of the momentum, in ``[0, 1]``.
        nesterov: Nesterov momentum (needs ``momentum > 0`` and ``dampening == 0``).
        weight_decay: the L2 penalty added to the gradient, ``>= 0``, or a schedule.
        maximize: maximize the objective instead of minimizing it.
        accumulator_dtype: ``None`` (the parameters' dtype) or the floating dtype the momentum
            buffers are kept in, optax's (see :func:`trace`).

    Returns:
        A :class:`GradientTransformation`: the :func:`chain` of ``scale(-1.0)`` (when
        ``maximize``), :func:`add_decayed_weights` (when ``weight_decay`` is not 0),
        :func:`trace` (when ``momentum`` is not 0) and :func:`scale_by_learning_rate`; its
        state is the tuple of theirs (a single part's state alone).

    Raises:
        TypeError: for arguments of the wrong type, or both or neither of ``lr`` and
            ``learning_rate``.
        ValueError: for out-of-range values or Nesterov without momentum or with dampening.

    Example:
        >>> from sbfunc import optim
        >>> opt = optim.sgd(0.1, momentum=0.9)
        >>> params = {"w": torch.tensor([1.0, 2.0])}
        >>> state = opt.init(params)
        >>> for _ in range(2):
        ...     updates, state = opt.update({"w": torch.ones(2)}, state, params)
        ...     params = optim.apply_updates(params, updates)
        >>> params["w"]
        tensor([0.7100, 1.7100])

    References:
        PyTorch ``torch.optim.SGD`` (its foreach implementation and first-step buffer rule);
        Sutskever et al. 2013, "On the importance of initialization and momentum in deep
        learning"; DeepMind optax ``sgd``.
    """
    args = _check_sgd("sgd", lr, learning_rate, momentum, dampening, nesterov,
                      weight_decay, maximize, accumulator_dtype)  # fmt: skip
    parts = [*_head(args, l2=True), scale_by_learning_rate(args["lr"])]
    return optimizer_of(call_repr("sgd", args), parts)


def decoupled_sgdw(
    lr: HParam | None = None,
    *,
    learning_rate: HParam | None = None,
    momentum: float = 0.0,
    dampening: float = 0.0,
    nesterov: bool = False,
    weight_decay: HParam = 0.0,
    maximize: bool = False,
    initial_lr: float | None = None,
    accumulator_dtype: torch.dtype | None = None,
) -> GradientTransformation:
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
        lr: the learning rate, ``>= 0``, or a schedule (0 needs ``initial_lr``).
        learning_rate: ``lr`` in optax's spelling; give one of the two.
        momentum: the momentum factor, ``>= 0``.
        dampening: the dampening of the momentum, in ``[0, 1]``.
        nesterov: Nesterov momentum (needs ``momentum > 0`` and ``dampening == 0``).
        weight_decay: the decoupled decay per step at ``lr_t == initial_lr``, ``>= 0``, or a
            schedule.
        maximize: maximize the objective (an sbfunc extension; Composer has none).
        initial_lr: Composer's base learning rate, ``> 0``; defaults to ``lr`` (a float) or
            the schedule's value at step 0 (give it, e.g. the peak, for a warm-up from 0).
        accumulator_dtype: as in :func:`sgd`.

    Returns:
        A :class:`GradientTransformation`: as :func:`sgd` without the L2 term, then
        :func:`decoupled_weight_decay` (when ``weight_decay`` is not 0).

    Raises:
        TypeError: for arguments of the wrong type, or both or neither of ``lr`` and
            ``learning_rate``.
        ValueError: for out-of-range values, Nesterov without momentum or with dampening, or
            no positive ``initial_lr``.

    Example:
        >>> from sbfunc import optim
        >>> opt = optim.decoupled_sgdw(0.1, weight_decay=0.5)
        >>> params = {"w": torch.tensor([1.0, 2.0])}
        >>> updates, _ = opt.update({"w": torch.zeros(2)}, opt.init(params), params)
        >>> optim.apply_updates(params, updates)["w"]
        tensor([0.5000, 1.0000])

    References:
        MosaicML Composer ``composer.optim.DecoupledSGDW``; Loshchilov and Hutter 2019,
        "Decoupled Weight Decay Regularization"; PyTorch ``torch.optim.SGD``.
    """
    args = _check_sgd("decoupled_sgdw", lr, learning_rate, momentum, dampening, nesterov,
                      weight_decay, maximize, accumulator_dtype)  # fmt: skip
    args["initial_lr"] = start = check_initial_lr(initial_lr, args["lr"])
    parts = [*_head(args, l2=False), scale_by_learning_rate(args["lr"])]
    if not is_zero(args["weight_decay"]):
        wd = args["weight_decay"]
        parts.append(decoupled_weight_decay(wd, learning_rate=args["lr"], initial_lr=start))
    return optimizer_of(call_repr("decoupled_sgdw", args), parts)
