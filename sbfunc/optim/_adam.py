"""Adam, AdamW (``torch.optim.Adam``/``AdamW``) and Composer's ``DecoupledAdamW`` as chains
of gradient transformations."""

from __future__ import annotations

from typing import Any

import torch

from sbfunc.optim._base import GradientTransformation, is_zero, optimizer_of
from sbfunc.optim._checks import call_repr, check_real_or_schedule, learning_rate_of
from sbfunc.optim._moments import ScaleByAdamRecord, check_adam
from sbfunc.optim._transforms import (
    HParam,
    add_decayed_weights,
    check_initial_lr,
    decoupled_weight_decay,
    scale,
)
from sbfunc.validation import check_bool

__all__ = ["adam", "adamw", "decoupled_adamw"]


def _check_adam(
    name: str,
    lr: HParam | None,
    learning_rate: HParam | None,
    b1: float,
    b2: float,
    eps: float,
    weight_decay: HParam,
    amsgrad: bool,
    maximize: bool,
    mu_dtype: torch.dtype | None,
) -> dict[str, Any]:
    """The checked arguments of an Adam optimizer, in the order of its repr; ``mu_dtype`` only
    when set. Given one by one, not as ``locals()``: ``inject_hyperparams`` builds the optimizer
    inside the (compiled) update, and torch 2.11's dynamo cannot trace ``locals()``."""
    rate = learning_rate_of(name, lr, learning_rate)
    checked = check_adam(b1, b2, eps, amsgrad, mu_dtype)
    args = {
        "lr": check_real_or_schedule(rate, "lr" if lr is not None else "learning_rate"),
        "b1": checked["b1"],
        "b2": checked["b2"],
        "eps": checked["eps"],
        "weight_decay": check_real_or_schedule(weight_decay, "weight_decay"),
        "amsgrad": checked["amsgrad"],
        "maximize": check_bool(maximize, "maximize"),
    }
    if checked["mu_dtype"] is not None:
        args["mu_dtype"] = checked["mu_dtype"]
    return args


def _adam(
    name: str, args: dict[str, Any], *, l2: bool, initial_lr: float | None = None
) -> GradientTransformation:
    """``scale(-1.0)`` (``maximize``), the L2 term (``l2``), :func:`scale_by_adam` with the
    learning rate, and the decoupled decay (``initial_lr``: Composer's; else torch's)."""
    wd, lr = args["weight_decay"], args["lr"]
    parts = [scale(-1.0)] if args["maximize"] else []
    if l2 and not is_zero(wd):
        parts.append(add_decayed_weights(wd))
    moments = ScaleByAdamRecord(
        name="scale_by_adam",
        b1=args["b1"],
        b2=args["b2"],
        eps=args["eps"],
        amsgrad=args["amsgrad"],
        learning_rate=lr,
        lerp=initial_lr is None,  # Composer's first moment: mul + add instead of lerp
        mu_dtype=args.get("mu_dtype"),
    )
    parts.append(moments.transformation())
    if not l2 and not is_zero(wd):
        start = 1.0 if initial_lr is None else initial_lr
        parts.append(decoupled_weight_decay(wd, learning_rate=lr, initial_lr=start))
    shown = args if initial_lr is None else {**args, "initial_lr": initial_lr}
    return optimizer_of(call_repr(name, shown), parts)


def adam(
    lr: HParam | None = None,
    *,
    learning_rate: HParam | None = None,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: HParam = 0.0,
    amsgrad: bool = False,
    maximize: bool = False,
    mu_dtype: torch.dtype | None = None,
) -> GradientTransformation:
    """Adam, exactly as ``torch.optim.Adam`` (weight decay as an L2 term in the gradient).

    Per step ``t`` (from 1), with ``g`` the gradient (negated when ``maximize``) plus
    ``weight_decay * p``: ``m = lerp(m, g, 1 - b1)``, ``v = b2 * v + (1 - b2) * g**2``
    (AMSGrad: ``v_max = max(v_max, v)`` is used below instead of ``v``), and the update is
    ``-lr / (1 - b1**t) * m / (sqrt(v) / sqrt(1 - b2**t) + eps)``. The bias corrections
    are 0-d float64 tensors computed from ``count`` (no host sync, no recompilation), each
    quantity is one foreach kernel over all parameters, and the inputs are never modified.
    The state and ``apply_updates(params, updates)`` equal torch's bit for bit (torch's last
    operation, ``addcdiv_``, divides, then adds the parameter), complex parameters included:
    as torch, the moments run on their real and imaginary parts (``torch.view_as_real``), so
    ``v`` averages ``|g|**2`` part by part. Gradients of another dtype than the parameters
    (bfloat16 gradients of float32 parameters, or the reverse) are cast to the parameters'
    dtype, in which the state is kept and the updates come out.

    Args:
        lr: the learning rate, ``>= 0`` (as torch.optim and optax: 0 updates by zeros), or a
            schedule (``count -> 0-d tensor``, evaluated inside ``update`` on the steps taken
            so far, like ``torch.optim.lr_scheduler``).
        learning_rate: ``lr`` in optax's spelling; give one of the two.
        b1: the decay of the first-moment average, in ``[0, 1)``.
        b2: the decay of the second-moment average, in ``[0, 1)``.
        eps: added to the denominator, ``>= 0``.
        weight_decay: the L2 penalty added to the gradient, ``>= 0``, or a schedule.
        amsgrad: use the running maximum of the second moment (AMSGrad).
        maximize: maximize the objective instead of minimizing it.
        mu_dtype: ``None`` (the parameters' dtype) or the floating dtype the first moment is
            kept in, optax's (see :func:`scale_by_adam`).

    Returns:
        A :class:`GradientTransformation`: the :func:`chain` of ``scale(-1.0)`` (when
        ``maximize``), :func:`add_decayed_weights` (when ``weight_decay`` is not 0) and
        :func:`scale_by_adam` with the learning rate; its state is the tuple of theirs (a
        single part's state alone: :class:`ScaleByAdamState`).

    Raises:
        TypeError: for arguments of the wrong type, or both or neither of ``lr`` and
            ``learning_rate``.
        ValueError: for out-of-range values.

    Example:
        >>> from sbfunc import optim
        >>> opt = optim.adam(0.1)
        >>> params = {"w": torch.tensor([1.0, -1.0])}
        >>> updates, state = opt.update({"w": torch.tensor([2.0, -3.0])}, opt.init(params), params)
        >>> optim.apply_updates(params, updates)["w"]
        tensor([ 0.9000, -0.9000])

    References:
        Kingma and Ba 2015, "Adam: A Method for Stochastic Optimization"; Reddi et al. 2018,
        "On the Convergence of Adam and Beyond" (AMSGrad); PyTorch ``torch.optim.Adam``;
        DeepMind optax ``adam``.
    """
    args = _check_adam(
        "adam", lr, learning_rate, b1, b2, eps, weight_decay, amsgrad, maximize, mu_dtype
    )
    return _adam("adam", args, l2=True)


def adamw(
    lr: HParam | None = None,
    *,
    learning_rate: HParam | None = None,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: HParam = 1e-2,
    amsgrad: bool = False,
    maximize: bool = False,
    mu_dtype: torch.dtype | None = None,
) -> GradientTransformation:
    """AdamW, as ``torch.optim.AdamW``: Adam with decoupled weight decay.

    Each step multiplies the parameters by ``1 - lr_t * weight_decay`` and takes the
    :func:`adam` step without the L2 term: the chain of ``scale(-1.0)`` (when ``maximize``),
    :func:`scale_by_adam` and :func:`decoupled_weight_decay` (when ``weight_decay`` is not 0).
    The state equals torch's bit for bit; the parameters one rounding apart where torch
    multiplies them before adding the step (measured: at most 1 ulp on 0.2% of the entries
    over 25 steps).

    Args:
        lr: as in :func:`adam`.
        learning_rate: as in :func:`adam`.
        b1: as in :func:`adam`.
        b2: as in :func:`adam`.
        eps: as in :func:`adam`.
        amsgrad: as in :func:`adam`.
        maximize: as in :func:`adam`.
        mu_dtype: as in :func:`adam`.
        weight_decay: the decay per unit of learning rate, ``>= 0``, or a schedule (torch's
            default 1e-2, where optax's ``adamw`` has 1e-4).

    Returns:
        A :class:`GradientTransformation`: see :func:`adam`.

    Raises:
        TypeError: for arguments of the wrong type, or both or neither of ``lr`` and
            ``learning_rate``.
        ValueError: for out-of-range values.

    Example:
        >>> from sbfunc import optim
        >>> opt = optim.adamw(0.1, weight_decay=0.5)
        >>> params = {"w": torch.tensor([1.0, -1.0])}
        >>> updates, state = opt.update({"w": torch.tensor([2.0, -3.0])}, opt.init(params), params)
        >>> optim.apply_updates(params, updates)["w"]
        tensor([ 0.8500, -0.8500])

    References:
        Loshchilov and Hutter 2019, "Decoupled Weight Decay Regularization"; PyTorch
        ``torch.optim.AdamW``; DeepMind optax ``adamw``.
    """
    args = _check_adam(
        "adamw", lr, learning_rate, b1, b2, eps, weight_decay, amsgrad, maximize, mu_dtype
    )
    return _adam("adamw", args, l2=False)


def decoupled_adamw(
    lr: HParam | None = None,
    *,
    learning_rate: HParam | None = None,
    b1: float = 0.9,
    b2: float = 0.95,
    eps: float = 1e-8,
    weight_decay: HParam = 1e-5,
    amsgrad: bool = False,
    maximize: bool = False,
    initial_lr: float | None = None,
    mu_dtype: torch.dtype | None = None,
) -> GradientTransformation:
    """Adam with weight decay decoupled from the learning rate, as Composer's
    ``DecoupledAdamW``.

    Each step multiplies the parameters by ``1 - (lr_t / initial_lr) * weight_decay`` and
    takes the Adam step (first moment as ``b1 * m + (1 - b1) * g``, Composer's rounding
    order): :func:`adamw`'s chain with Composer's factor. The state equals Composer's bit for
    bit, the parameters up to one rounding per step (see :func:`adamw`). Unlike
    ``torch.optim.AdamW`` (factor ``1 - lr_t * weight_decay``), the decay per step follows the
    learning-rate *schedule* but not the learning-rate *value*: with a constant ``lr`` each
    step multiplies the parameters by exactly ``1 - weight_decay``, so torch's
    ``weight_decay=w`` matches ``weight_decay=lr * w`` here. Defaults are Composer's
    (``b2=0.95``, ``weight_decay=1e-5``).

    Args:
        lr: as in :func:`adam`.
        learning_rate: as in :func:`adam`.
        b1: as in :func:`adam`.
        b2: as in :func:`adam`.
        eps: as in :func:`adam`.
        amsgrad: as in :func:`adam`.
        weight_decay: the decay per step at ``lr_t == initial_lr``, ``>= 0``, or a schedule.
        maximize: maximize the objective (an sbfunc extension; Composer has none).
        initial_lr: Composer's base learning rate, ``> 0``; defaults to ``lr`` (a float) or
            the schedule's value at step 0 (give it, e.g. the peak, for a warm-up from 0).
        mu_dtype: as in :func:`adam`.

    Returns:
        A :class:`GradientTransformation`: see :func:`adam`.

    Raises:
        TypeError: for arguments of the wrong type, or both or neither of ``lr`` and
            ``learning_rate``.
        ValueError: for out-of-range values or no positive ``initial_lr``.

    Example:
        >>> from sbfunc import optim
        >>> opt = optim.decoupled_adamw(0.1, weight_decay=0.5)
        >>> params = {"w": torch.tensor([1.0, -1.0])}
        >>> updates, state = opt.update({"w": torch.tensor([2.0, -3.0])}, opt.init(params), params)
        >>> optim.apply_updates(params, updates)["w"]
        tensor([ 0.4000, -0.4000])

    References:
        MosaicML Composer ``composer.optim.DecoupledAdamW``; Loshchilov and Hutter 2019,
        "Decoupled Weight Decay Regularization"; PyTorch ``torch.optim.AdamW``.
    """
    args = _check_adam("decoupled_adamw", lr, learning_rate, b1, b2, eps, weight_decay,
                       amsgrad, maximize, mu_dtype)  # fmt: skip
    start = check_initial_lr(initial_lr, args["lr"])
    return _adam("decoupled_adamw", args, l2=False, initial_lr=start)
