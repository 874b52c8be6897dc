"""Gradient accumulation as a wrapper: :func:`multi_steps` applies the inner transformation
once every ``k`` gradients (optax's ``MultiSteps``)."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import torch

from sbfunc.optim._base import (
    GradientTransformation,
    TransformRecord,
    by_group,
    cast_like,
    zero_count,
)
from sbfunc.optim._finite import host_flag, keep_if_finite, negative_zeros
from sbfunc.types import Params
from sbfunc.validation import check_bool, check_int

__all__ = ["MultiStepsState", "multi_steps"]


class MultiStepsState(NamedTuple):
    """The state of :func:`multi_steps`.

    Attributes:
        mini_step: 0-d int64 tensor, the gradients accumulated since the last inner update.
        gradient_step: 0-d int64 tensor, the inner updates made.
        inner_state: the wrapped transformation's state.
        acc_grads: the sum of the gradients accumulated, keyed like the parameters (``-0.0``
            after an inner update: ``-0.0 + g == g`` bit for bit).

    Example:
        >>> from sbfunc import optim
        >>> state = optim.multi_steps(optim.sgd(0.1), 2).init({"w": torch.ones(2)})
        >>> state.mini_step, state.acc_grads
        (tensor(0), {'w': tensor([-0., -0.])})

    References:
        DeepMind optax ``MultiStepsState``.
    """

    mini_step: torch.Tensor
    gradient_step: torch.Tensor
    inner_state: Any
    acc_grads: dict[str, torch.Tensor]


@dataclasses.dataclass(frozen=True, repr=False)
class _MultiSteps(TransformRecord):
    inner: GradientTransformation
    every_k: int
    use_mean: bool = True

    def init(self, params: Params) -> MultiStepsState:
        zero = zero_count(params)
        return MultiStepsState(zero, zero.clone(), self.inner.init(params), negative_zeros(params))

    def update(
        self, updates: Params, state: MultiStepsState, params: Params | None = None
    ) -> tuple[Params, MultiStepsState]:
        updates = cast_like(updates, state.acc_grads)  # accumulated in the parameters' dtype
        acc = by_group(lambda a, g: (list(torch._foreach_add(a, g)),), state.acc_grads, updates)[0]
        emit = state.mini_step == self.every_k - 1
        host = host_flag(emit)
        if host is False:  # eagerly on the CPU: no inner update to compute
            return negative_zeros(updates), state._replace(
                mini_step=state.mini_step + 1, acc_grads=acc
            )
        grads = acc
        if self.use_mean and self.every_k > 1:
            grads = by_group(lambda a: (list(torch._foreach_div(a, self.every_k)),), acc)[0]
        out, inner = self.inner.update(grads, state.inner_state, params)
        zeros = negative_zeros(acc)
        if host is None:
            out = {k: torch.where(emit, u, -0.0) for k, u in out.items()}
            inner = keep_if_finite(emit, inner, state.inner_state)
            zeros = {k: torch.where(emit, z, acc[k]) for k, z in zeros.items()}
        step = emit.long()
        return out, MultiStepsState(
            (state.mini_step + 1) * (1 - step), state.gradient_step + step, inner, zeros
        )


def multi_steps(
    inner: GradientTransformation, every_k: int, *, use_mean: bool = True
) -> GradientTransformation:
    """Accumulate ``every_k`` gradients, then apply ``inner`` once to their mean (or sum).

    Calls ``1 .. k-1`` of every ``k`` add the gradients to ``acc_grads`` and return ``-0.0``
    updates (which leave the parameters bit for bit); call ``k`` gives ``inner`` the mean
    ``(g_1 + ... + g_k) / k`` (summed in order, then divided), or with ``use_mean=False`` the
    sum, and returns its updates. So ``k`` equal-size chunks of a batch, each with the gradient
    of its mean loss, make one step on the gradient of the whole batch's mean loss (up to the
    rounding of the sum). For chunks of unequal sizes, scale each chunk's gradient by its share
    of the rows and pass ``use_mean=False``: the sum is then the whole batch's gradient, in the
    order of the rounding of :mod:`sbfunc.step.microbatch`. ``every_k`` is not part of the
    state, so ``multi_steps(inner, k)`` for different ``k`` share one state between complete
    accumulations (a caller whose number of chunks changes from batch to batch may build one per
    count). No host sync: on an accelerator or under ``torch.compile`` the inner update is
    computed at every call and ``torch.where`` selects; eagerly on the CPU it runs only at
    call ``k``.

    Wrap the guard inside (``multi_steps(apply_if_finite(opt), k)``) to skip a whole
    accumulation whose gradient is not finite; ``apply_if_finite(multi_steps(opt, k))`` would
    drop the non-finite chunk alone and apply the others.

    Args:
        inner: the transformation to apply every ``k`` gradients.
        every_k: ``k``, the gradients per update, ``>= 1``.
        use_mean: average the ``k`` gradients (optax's default), else sum them.

    Returns:
        A :class:`GradientTransformation` with state :class:`MultiStepsState`.

    Raises:
        TypeError: for arguments of the wrong type.
        ValueError: if ``every_k < 1``.

    Example:
        >>> from sbfunc import optim
        >>> opt = optim.multi_steps(optim.sgd(1.0), 2)
        >>> state = opt.init({"w": torch.zeros(1)})
        >>> for g in (1.0, 3.0):
        ...     updates, state = opt.update({"w": torch.tensor([g])}, state)
        ...     print(updates["w"], state.gradient_step)
        tensor([-0.]) tensor(0)
        tensor([-2.]) tensor(1)

    References:
        DeepMind optax ``MultiSteps``; MosaicML Composer's gradient accumulation
        (``device_train_microbatch_size``).
    """
    if not (callable(getattr(inner, "init", None)) and callable(getattr(inner, "update", None))):
        raise TypeError(f"inner must be a GradientTransformation, got {type(inner).__name__}")
    k = check_int(every_k, "every_k", low=1)
    mean = check_bool(use_mean, "use_mean")
    return _MultiSteps(name="multi_steps", inner=inner, every_k=k, use_mean=mean).transformation()
