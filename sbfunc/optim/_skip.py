"""The ``should_skip_update_fn`` of :func:`multi_steps` (optax's ``MultiSteps``): functions of
``(updates, gradient_step, params)`` returning ``(should_skip, skip_state)``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from sbfunc.types import Params
from sbfunc.validation import check_real
from sbfunc.validation import describe as describe_value

__all__ = ["ShouldSkipUpdateFn", "check_skip_flag", "skip_large_updates", "skip_not_finite"]

ShouldSkipUpdateFn = Callable[[Params, torch.Tensor, Params | None], tuple[torch.Tensor, Any]]
"""``(updates, gradient_step, params) -> (should_skip, skip_state)``: ``should_skip`` a 0-d bool
tensor, ``skip_state`` a pytree of tensors of a fixed structure (stored in
:class:`MultiStepsState`), optax's ``ShouldSkipUpdateFunction``."""


def _per_leaf(
    fn: Callable[[torch.Tensor], torch.Tensor], updates: Params, home: torch.Tensor
) -> list[torch.Tensor]:
    """``fn`` of every update (complex ones as real pairs), moved to ``home``'s device."""
    return [
        fn(torch.view_as_real(u) if u.is_complex() else u).to(home.device)
        for u in updates.values()
    ]


def skip_not_finite(
    updates: Params, gradient_step: torch.Tensor, params: Params | None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Skip a micro-step whose updates hold a NaN or an infinity.

    Args:
        updates: the micro-step's gradients.
        gradient_step: :class:`MultiStepsState`'s ``gradient_step`` (unused).
        params: the parameters, or ``None`` (unused).

    Returns:
        ``(should_skip, {"should_skip": ..., "num_not_finite": ...})``: 0-d tensors on
        ``gradient_step``'s device, ``num_not_finite`` the non-finite entries counted (int64;
        a complex entry counts its parts). No host sync.

    Example:
        >>> from sbfunc import optim
        >>> optim.skip_not_finite({"w": torch.tensor([1.0, float("inf")])}, torch.tensor(0), None)
        (tensor(True), {'should_skip': tensor(True), 'num_not_finite': tensor(1)})

    References:
        DeepMind optax ``skip_not_finite``.
    """
    counts = _per_leaf(lambda u: (~torch.isfinite(u)).sum(), updates, gradient_step)
    total = torch.stack(counts).sum() if counts else torch.zeros_like(gradient_step)
    should_skip = total > 0
    return should_skip, {"should_skip": should_skip, "num_not_finite": total}


def skip_large_updates(
    updates: Params,
    gradient_step: torch.Tensor,
    params: Params | None,
    max_squared_norm: float | torch.Tensor,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Skip a micro-step whose squared global norm is not below ``max_squared_norm``.

    ``should_skip = not (||u||**2 < max_squared_norm)``, so a NaN norm skips too. Give it to
    :func:`multi_steps` with the bound bound: ``functools.partial(skip_large_updates,
    max_squared_norm=100.0)``.

    Args:
        updates: the micro-step's gradients.
        gradient_step: :class:`MultiStepsState`'s ``gradient_step`` (unused).
        params: the parameters, or ``None`` (unused).
        max_squared_norm: the bound on the squared norm, a float ``>= 0`` or a 0-d tensor.

    Returns:
        ``(should_skip, {"should_skip": ..., "norm_squared": ...})``: 0-d tensors on
        ``gradient_step``'s device; ``norm_squared`` sums the squares of every entry (of the
        parts of complex ones) in the updates' dtype (the widest of them). No host sync.

    Raises:
        TypeError: if ``max_squared_norm`` is neither a number nor a 0-d tensor.
        ValueError: if a number ``max_squared_norm`` is negative or not finite.

    Example:
        >>> from sbfunc import optim
        >>> optim.skip_large_updates({"w": torch.tensor([11.0])}, torch.tensor(0), None, 100.0)
        (tensor(True), {'should_skip': tensor(True), 'norm_squared': tensor(121.)})

    References:
        DeepMind optax ``skip_large_updates``.
    """
    bound = max_squared_norm
    if not isinstance(bound, torch.Tensor) or bound.dim() != 0:
        bound = check_real(bound, "max_squared_norm", low=0.0)
    squares = _per_leaf(lambda u: u.square().sum(), updates, gradient_step)
    if squares:
        dtype = functools.reduce(torch.promote_types, (s.dtype for s in squares))
        norm_sq = torch.stack([s.to(dtype) for s in squares]).sum()
    else:
        norm_sq = torch.zeros((), device=gradient_step.device)
    should_skip = torch.logical_not(norm_sq < bound)
    return should_skip, {"should_skip": should_skip, "norm_squared": norm_sq}


def check_skip_flag(flag: Any) -> torch.Tensor:
    """``flag`` when it is a 0-d bool tensor, else a ``ValueError`` naming the function that
    returned it."""
    if not (isinstance(flag, torch.Tensor) and flag.dtype == torch.bool and flag.dim() == 0):
        raise ValueError(
            "should_skip_update_fn must return (should_skip, skip_state) with should_skip a "
            f"0-d bool tensor, got {describe_value(flag)}"
        )
    return flag
