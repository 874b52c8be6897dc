""":func:`apply_if_finite`, which skips the updates of non-finite gradients (the finiteness
check and the leafwise select it uses live in :mod:`sbfunc._finite`)."""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, NamedTuple

import torch

from sbfunc._finite import all_finite, keep_if_finite
from sbfunc._tracing import host_flag
from sbfunc.optim._base import (
    GradientTransformation,
    TransformRecord,
    zero_count,
)
from sbfunc.types import Params
from sbfunc.validation import check_int

__all__ = [
    "ApplyIfFiniteState",
    "apply_if_finite",
    "negative_zeros",
    "skipped_updates",
    "update_if",
]


def negative_zeros(updates: Params) -> Params:
    """``-0.0`` like every update: the update that leaves every parameter bit for bit."""
    return {k: torch.full_like(u, -0.0) for k, u in updates.items()}


# The dtypes of the inner updates of the wrappers' skipped calls, by the wrapper's record and
# the layout of dtypes: a memo beside the records, which stay as built (entries go with them).
_SKIPPED: dict[int, dict[tuple[Any, ...], dict[str, torch.dtype]]] = {}


def skipped_updates(
    owner: object,
    inner: GradientTransformation,
    updates: Params,
    state: Any,
    params: Params | None,
) -> Params:
    """``-0.0`` like ``updates``, in the dtypes of ``inner.update(updates, state, params)``:
    the updates of a call of the wrapper ``owner`` that skips its inner transformation, in one
    dtype with its other calls' (optax: ``jax.eval_shape`` of the skipped update; Adam with
    ``mu_dtype=torch.float32`` updates float16 parameters in float32). The inner update runs
    once per layout of dtypes (the updates' and the parameters', which fix the state's at
    ``init``), remembered."""
    memo = _SKIPPED.get(id(owner))
    if memo is None:
        memo = _SKIPPED[id(owner)] = {}
        weakref.finalize(owner, _SKIPPED.pop, id(owner), None)
    key = (
        tuple((k, u.dtype) for k, u in updates.items()),
        None if params is None else tuple(p.dtype for p in params.values()),
    )
    dtypes = memo.get(key)
    if dtypes is None:
        if len(memo) >= 16:  # (bounded: layouts hardly change)
            memo.clear()
        out, _ = inner.update(updates, state, params)
        dtypes = memo[key] = {k: u.dtype for k, u in out.items()}
    zeros = negative_zeros(updates)
    return {k: z if z.dtype == dtypes[k] else z.to(dtypes[k]) for k, z in zeros.items()}


class ApplyIfFiniteState(NamedTuple):
    """The state of :func:`apply_if_finite`.

    Attributes:
        notfinite_count: 0-d int64 tensor, the non-finite updates in a row (0 after a finite
            one).
        last_finite: 0-d bool tensor, whether the last update's gradients were finite.
        total_notfinite: 0-d int64 tensor, the non-finite updates so far.
        inner_state: the wrapped transformation's state.

    Example:
        >>> from sbfunc import optim
        >>> state = optim.apply_if_finite(optim.sgd(0.1)).init({"w": torch.ones(1)})
        >>> state.notfinite_count, state.last_finite, state.inner_state
        (tensor(0), tensor(True), EmptyState())

    References:
        DeepMind optax ``ApplyIfFiniteState``.
    """

    notfinite_count: torch.Tensor
    last_finite: torch.Tensor
    total_notfinite: torch.Tensor
    inner_state: Any


@dataclasses.dataclass(frozen=True, repr=False)
class _ApplyIfFinite(TransformRecord):
    inner: GradientTransformation
    max_consecutive_errors: int | None = None

    def init(self, params: Params) -> ApplyIfFiniteState:
        zero = zero_count(params)
        return ApplyIfFiniteState(zero, zero == 0, zero.clone(), self.inner.init(params))

    def update(
        self, updates: Params, state: ApplyIfFiniteState, params: Params | None = None
    ) -> tuple[Params, ApplyIfFiniteState]:
        finite = all_finite(updates.values()).to(state.last_finite.device)
        notfinite = (~finite).long()
        count = (state.notfinite_count + 1) * notfinite
        apply = finite
        if self.max_consecutive_errors is not None:
            apply = finite | (count > self.max_consecutive_errors)
        out, inner = update_if(apply, self.inner, updates, state.inner_state, params, owner=self)
        return out, ApplyIfFiniteState(count, finite, state.total_notfinite + notfinite, inner)


def update_if(
    apply: torch.Tensor,
    inner: GradientTransformation,
    updates: Params,
    state: Any,
    params: Params | None,
    *,
    owner: object,
) -> tuple[Params, Any]:
    """``inner.update(updates, state, params)`` where the 0-d bool ``apply`` holds, else
    ``-0.0`` updates (in the dtypes of the inner update's) and ``state`` unchanged; no host
    sync (the shared core of :func:`apply_if_finite` and
    :func:`~sbfunc.optim.dynamic_loss_scale`).

    Eagerly on the CPU the flag is read and a skipped update does no work (but to find its
    dtypes once per layout: :func:`skipped_updates` of the wrapper ``owner``); on an
    accelerator or under ``torch.compile`` the inner update always runs and ``torch.where``
    selects.
    """
    host = host_flag(apply)
    if host is False:  # eagerly on the CPU: skip the inner update altogether
        return skipped_updates(owner, inner, updates, state, params), state
    out, new = inner.update(updates, state, params)
    if host is None:
        out = {k: torch.where(apply, u, -0.0) for k, u in out.items()}
        new = keep_if_finite(apply, new, state)
    return out, new


def apply_if_finite(
    inner: GradientTransformation, max_consecutive_errors: int | None = None
) -> GradientTransformation:
    """Skip the update of non-finite gradients: ``-0.0`` updates, ``inner``'s state unchanged.

    The check covers the incoming updates (the gradients, when this wraps the whole chain) in
    one fused kernel per device (:func:`all_finite`) and never syncs with the host: on an
    accelerator or under ``torch.compile`` the inner update always runs and ``torch.where``
    selects, eagerly on the CPU the flag is read and a skipped update does no work (but for
    one run per layout of dtypes: a skipped update comes in the dtype of ``inner``'s, as
    optax's). A ``-0.0`` update leaves the parameters bit for bit under :func:`apply_updates`.
    Skips are counted in the state (``last_finite`` is the flag a training step reports).

    Args:
        inner: the transformation to guard.
        max_consecutive_errors: ``None`` (default): always skip; else after this many
            non-finite updates in a row the next one is applied (optax's rule, so a diverged
            run shows as non-finite parameters instead of silently standing still).

    Returns:
        A :class:`GradientTransformation` with state :class:`ApplyIfFiniteState`.

    Raises:
        TypeError: if ``inner`` is not a transformation or ``max_consecutive_errors`` is not
            an int.
        ValueError: if ``max_consecutive_errors`` is negative.

    Example:
        >>> from sbfunc import optim
        >>> opt, params = optim.apply_if_finite(optim.sgd(0.1)), {"w": torch.ones(2)}
        >>> updates, state = opt.update({"w": torch.tensor([1.0, float("inf")])}, opt.init(params))
        >>> updates["w"], state.total_notfinite
        (tensor([-0., -0.]), tensor(1))

    References:
        DeepMind optax ``apply_if_finite``; PyTorch ``torch.amp.GradScaler`` (skipping the
        steps of non-finite gradients).
    """
    if not (callable(getattr(inner, "init", None)) and callable(getattr(inner, "update", None))):
        raise TypeError(f"inner must be a GradientTransformation, got {type(inner).__name__}")
    if max_consecutive_errors is not None:
        max_consecutive_errors = check_int(max_consecutive_errors, "max_consecutive_errors", low=0)
    return _ApplyIfFinite(
        name="apply_if_finite", inner=inner, max_consecutive_errors=max_consecutive_errors
    ).transformation()
