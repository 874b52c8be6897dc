"""The optimizer type and the foreach helpers the optimizers share."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from sbfunc.module import Params
from sbfunc.optim._checks import describe
from sbfunc.optim._schedules import value_at
from sbfunc.validation import check_real

__all__ = [
    "Hyperparams",
    "Optimizer",
    "Scalar",
    "axpy",
    "check_grads",
    "check_initial_lr",
    "decoupled_decay",
    "groups",
    "is_zero",
    "on",
    "resolve",
    "zero_count",
]

Scalar = float | torch.Tensor
"""A hyperparameter's value in one step: a Python float, or a 0-d float64 tensor."""


class Optimizer(NamedTuple):
    """An optimizer as two pure functions: ``init(params)`` and ``update(grads, state,
    params)``.

    ``new_params, new_state = update(grads, state, params)`` returns the *new parameters*
    (not optax-style deltas) and the next state; it never modifies ``grads``, ``state`` or
    ``params``. States are NamedTuples of tensors and of dicts of tensors keyed like
    ``params``, with a fixed structure from ``init`` on (they checkpoint against a fresh
    ``init(params)`` and compile once), and a 0-d int64 ``count`` of the steps taken.

    Attributes:
        init: ``params -> state``.
        update: ``(grads, state, params) -> (new_params, new_state)``; ``grads`` has the keys
            of ``params``.

    Example:
        >>> from sbfunc import optim
        >>> opt = optim.sgd(0.1)
        >>> params = {"w": torch.ones(2)}
        >>> new_params, state = opt.update({"w": torch.ones(2)}, opt.init(params), params)
        >>> new_params["w"], state.count
        (tensor([0.9000, 0.9000]), tensor(1))
        >>> opt
        sgd(lr=0.1, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0, maximize=False)

    References:
        DeepMind optax ``GradientTransformation``; PyTorch ``torch.optim`` (which updates the
        parameters itself, with one foreach kernel per quantity).
    """

    init: Callable[[Params], Any]
    update: Callable[[Params, Any, Params], tuple[Params, Any]]

    def __repr__(self) -> str:
        owner = getattr(self.update, "__self__", None)
        if isinstance(owner, Hyperparams) and getattr(self.init, "__self__", None) is owner:
            return repr(owner)
        return f"Optimizer(init={self.init!r}, update={self.update!r})"


@dataclasses.dataclass(frozen=True, repr=False)
class Hyperparams:
    """Base of the optimizers' hyperparameter records: ``name`` is the factory that built it,
    and the repr reads as that call (fields declared with ``repr=False`` are left out)."""

    name: str = dataclasses.field(repr=False)

    def __repr__(self) -> str:
        shown = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.repr}
        return describe(self.name, shown)


def zero_count(params: Params) -> torch.Tensor:
    """A 0-d int64 zero on the device of the first parameter (CPU for no parameters)."""
    device = next(iter(params.values())).device if params else torch.device("cpu")
    return torch.zeros((), dtype=torch.int64, device=device)


def resolve(value: float | Callable[..., Any], count: torch.Tensor) -> Scalar:
    """A hyperparameter's value at ``count``: a float stays, a schedule is evaluated to a 0-d
    float64 tensor on the count's device (tensor ops only, no host sync)."""
    return value_at(value, count) if callable(value) else value


def check_grads(grads: Params, params: Params) -> None:
    """Raise ``ValueError`` unless ``grads`` and ``params`` are dicts with the same keys."""
    if not isinstance(grads, dict) or not isinstance(params, dict):
        raise TypeError(
            f"grads and params must be dicts of tensors, got {type(grads).__name__} and "
            f"{type(params).__name__}"
        )
    if grads.keys() != params.keys():
        missing = sorted(params.keys() - grads.keys())
        extra = sorted(grads.keys() - params.keys())
        raise ValueError(
            f"grads must have the keys of params; missing {missing}, unexpected {extra}"
        )


def groups(params: Params) -> list[list[str]]:
    """The keys of ``params`` grouped by (device, dtype), in order: one foreach call per group
    keeps every call on torch's fast multi-tensor path."""
    by: dict[tuple[torch.device, torch.dtype], list[str]] = {}
    for k, p in params.items():
        by.setdefault((p.device, p.dtype), []).append(k)
    return list(by.values())


def on(value: Scalar | None, like: torch.Tensor) -> Scalar | None:
    """``value`` with the device and dtype of ``like`` (floats and ``None`` unchanged).

    A 0-d float64 scalar would otherwise promote 0-d parameters to float64; for float32
    parameters the cast is the one torch applies to a Python-float scalar, so results stay
    bitwise equal. (For float16/bfloat16 parameters, scheduled values and Adam's bias
    corrections are thereby rounded to that dtype.)
    """
    if isinstance(value, torch.Tensor):
        return value.to(device=like.device, dtype=like.dtype)
    return value


def is_zero(value: Scalar) -> bool:
    """Whether a hyperparameter is the float 0 (a scheduled one never is, statically)."""
    return not isinstance(value, torch.Tensor) and value == 0


def check_initial_lr(initial_lr: float | None, lr: float | Callable[..., Any]) -> float:
    """The reference learning rate of Composer's decoupled weight decay: ``initial_lr`` when
    given (``> 0``), else a float ``lr`` itself, else the schedule's value at step 0, which must
    then be ``> 0`` (a warm-up from 0 needs an explicit ``initial_lr``, such as its peak)."""
    if initial_lr is not None:
        return check_real(initial_lr, "initial_lr", low=0.0, open_low=True)
    if not callable(lr):
        return lr
    first = float(value_at(lr, torch.zeros((), dtype=torch.int64)))  # once, at construction
    if not first > 0:
        raise ValueError(
            f"initial_lr is needed: the lr schedule is {first!r} at step 0, and the decoupled "
            "weight decay scales by lr / initial_lr; pass initial_lr > 0 (Composer's base "
            "learning rate, e.g. the schedule's peak)"
        )
    return first


def decoupled_decay(lr: Scalar, weight_decay: Scalar, initial_lr: float) -> Scalar | None:
    """Composer's per-step parameter factor ``1 - (lr / initial_lr) * weight_decay`` (``None``
    for a zero weight decay, which Composer skips)."""
    if is_zero(weight_decay):
        return None
    return 1 - (lr / initial_lr) * weight_decay


def axpy(
    x: list[torch.Tensor], y: list[torch.Tensor], alpha: Scalar, *, inplace: bool
) -> list[torch.Tensor]:
    """``x + alpha * y`` over the lists, into ``x`` when ``inplace`` (only for tensors the
    caller allocated) and into fresh tensors otherwise. A float ``alpha`` is one fused
    ``add(x, y, alpha=...)`` (as torch.optim); a tensor one multiplies first (torch.optim's
    compiled path)."""
    if not isinstance(alpha, torch.Tensor):
        if inplace:
            torch._foreach_add_(x, y, alpha=alpha)
            return x
        return list(torch._foreach_add(x, y, alpha=alpha))
    scaled = list(torch._foreach_mul(y, alpha))
    if inplace:
        torch._foreach_add_(x, scaled)
        return x
    torch._foreach_add_(scaled, x)
    return scaled
