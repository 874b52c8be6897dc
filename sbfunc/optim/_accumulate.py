"""Gradient accumulation as a wrapper: :func:`multi_steps` applies the inner transformation
once every ``k`` gradients (optax's ``MultiSteps``)."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import torch

from sbfunc._finite import keep_if_finite
from sbfunc._tracing import host_flag
from sbfunc.optim._base import (
    HIDDEN_UNSET,
    GradientTransformation,
    TransformRecord,
    by_group,
    cast_like,
    kept_in,
    narrowed,
    widened,
    zero_count,
)
from sbfunc.optim._checks import check_dtype
from sbfunc.optim._finite import negative_zeros, skipped_updates
from sbfunc.optim._masking import check_transformation
from sbfunc.optim._skip import ShouldSkipUpdateFn, check_skip_flag
from sbfunc.types import Params
from sbfunc.validation import check_bool, check_callable, check_int

__all__ = ["MultiStepsState", "multi_steps"]


class MultiStepsState(NamedTuple):
    """The state of :func:`multi_steps`.

    Attributes:
        mini_step: 0-d int64 tensor, the gradients accumulated since the last inner update.
        gradient_step: 0-d int64 tensor, the inner updates made.
        inner_state: the wrapped transformation's state.
        acc_grads: the sum of the gradients accumulated, keyed like the parameters (``-0.0``
            after an inner update: ``-0.0 + g == g`` bit for bit).
        skip_state: what ``should_skip_update_fn`` returned with its flag on the last call
            (``()`` without one), optax's debugging and monitoring slot.

    Example:
        >>> from sbfunc import optim
        >>> state = optim.multi_steps(optim.sgd(0.1), 2).init({"w": torch.ones(2)})
        >>> state.mini_step, state.acc_grads, state.skip_state
        (tensor(0), {'w': tensor([-0., -0.])}, ())

    References:
        DeepMind optax ``MultiStepsState``.
    """

    mini_step: torch.Tensor
    gradient_step: torch.Tensor
    inner_state: Any
    acc_grads: dict[str, torch.Tensor]
    skip_state: Any = ()


@dataclasses.dataclass(frozen=True, repr=False)
class _MultiSteps(TransformRecord):
    inner: GradientTransformation
    every_k: int
    use_mean: bool = True
    should_skip_update_fn: ShouldSkipUpdateFn | None = dataclasses.field(
        default=None, metadata=HIDDEN_UNSET
    )
    accumulator_dtype: torch.dtype | None = dataclasses.field(default=None, metadata=HIDDEN_UNSET)

    def init(self, params: Params) -> MultiStepsState:
        zero = zero_count(params)
        acc = negative_zeros(kept_in(self.accumulator_dtype, params))
        skip_state: Any = ()
        if self.should_skip_update_fn is not None:  # its state's structure, as optax
            zeros = {k: torch.zeros_like(p) for k, p in params.items()}
            _, skip_state = self.should_skip_update_fn(zeros, zero, params)
        return MultiStepsState(zero, zero.clone(), self.inner.init(params), acc, skip_state)

    def update(
        self, updates: Params, state: MultiStepsState, params: Params | None = None
    ) -> tuple[Params, MultiStepsState]:
        if self.should_skip_update_fn is None:
            return self.accumulate(updates, state, params)
        flag, skip_state = self.should_skip_update_fn(updates, state.gradient_step, params)
        skip = check_skip_flag(flag).to(state.mini_step.device)
        host = host_flag(skip)
        if host is True:  # eagerly on the CPU: the micro-step never happened
            like = (
                cast_like(updates, state.acc_grads) if self.accumulator_dtype is None else updates
            )
            out = skipped_updates(self, self.inner, like, state.inner_state, params)
            return out, state._replace(skip_state=skip_state)
        out, new = self.accumulate(updates, state, params)
        if host is None:
            out = {k: torch.where(skip, -0.0, u) for k, u in out.items()}
            new = keep_if_finite(~skip, new, state)
        return out, new._replace(skip_state=skip_state)

    def accumulate(
        self, updates: Params, state: MultiStepsState, params: Params | None
    ) -> tuple[Params, MultiStepsState]:
        """Add ``updates`` to the accumulator; on the ``k``-th call, the inner update."""
        kept = self.accumulator_dtype
        if kept is None:
            updates = cast_like(updates, state.acc_grads)  # in the parameters' dtype
        wide, acc = widened(kept, updates, state.acc_grads)
        acc = by_group(lambda a, g: (list(torch._foreach_add(a, g)),), acc, wide)[0]
        stored = narrowed(kept, acc)
        emit = state.mini_step == self.every_k - 1
        host = host_flag(emit)
        if host is False:  # eagerly on the CPU: no inner update to compute (``updates`` has
            # the dtypes of the inner update's input, for the dtypes of its output)
            out = skipped_updates(self, self.inner, updates, state.inner_state, params)
            return out, state._replace(mini_step=state.mini_step + 1, acc_grads=stored)
        grads = acc
        if self.use_mean and self.every_k > 1:
            grads = by_group(lambda a: (list(torch._foreach_div(a, self.every_k)),), acc)[0]
        if kept is not None:  # optax: the inner update sees the updates' dtype
            grads = cast_like(grads, updates)
        out, inner = self.inner.update(grads, state.inner_state, params)
        zeros = negative_zeros(stored)
        if host is None:
            out = {k: torch.where(emit, u, -0.0) for k, u in out.items()}
            inner = keep_if_finite(emit, inner, state.inner_state)
            zeros = {k: torch.where(emit, z, stored[k]) for k, z in zeros.items()}
        step = emit.long()
        return out, MultiStepsState(
            (state.mini_step + 1) * (1 - step),
            state.gradient_step + step,
            inner,
            zeros,
            state.skip_state,
        )


def multi_steps(
    inner: GradientTransformation,
    every_k: int,
    *,
    use_mean: bool = True,
    should_skip_update_fn: ShouldSkipUpdateFn | None = None,
    accumulator_dtype: torch.dtype | None = None,
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
    call ``k`` (and once more for each new layout of dtypes, to learn its updates' dtypes).
    Every call returns updates in the dtype of ``inner``'s updates, as optax's (Adam with
    ``mu_dtype=torch.float32`` updates float16 parameters in float32).

    Wrap the guard inside (``multi_steps(apply_if_finite(opt), k)``) to skip a whole
    accumulation whose gradient is not finite; ``should_skip_update_fn=skip_not_finite``
    (optax's) drops the non-finite chunk alone, as if it never came: it is not accumulated,
    ``mini_step`` does not advance, the updates are ``-0.0``, and the function's report is
    kept in ``skip_state``. Unlike optax's ``MultiSteps``, the mean is the sum divided by
    ``k`` (optax updates a running mean), and the accumulator is kept in the parameters'
    dtype unless ``accumulator_dtype`` says otherwise (optax: float32).

    Args:
        inner: the transformation to apply every ``k`` gradients.
        every_k: ``k``, the gradients per update, ``>= 1``.
        use_mean: average the ``k`` gradients (optax's default), else sum them.
        should_skip_update_fn: ``None``, or ``(updates, gradient_step, params) ->
            (should_skip, skip_state)`` (:func:`skip_not_finite`, :func:`skip_large_updates`)
            with ``should_skip`` a 0-d bool tensor.
        accumulator_dtype: ``None`` (the parameters' dtype) or the floating dtype
            ``acc_grads`` is kept in: each sum is computed in the wider of it and the
            gradient's dtype and only the stored one rounded; the inner update gets the sum
            in the gradients' dtype (optax's rule).

    Returns:
        A :class:`GradientTransformation` with state :class:`MultiStepsState`.

    Raises:
        TypeError: for arguments of the wrong type.
        ValueError: if ``every_k < 1``; at ``update``, a ``should_skip`` that is not a 0-d
            bool tensor.

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
    inner = check_transformation(inner, "inner")
    if should_skip_update_fn is not None:
        check_callable(should_skip_update_fn, "should_skip_update_fn")
    return _MultiSteps(
        name="multi_steps",
        inner=inner,
        every_k=check_int(every_k, "every_k", low=1),
        use_mean=check_bool(use_mean, "use_mean"),
        should_skip_update_fn=should_skip_update_fn,
        accumulator_dtype=check_dtype(accumulator_dtype, "accumulator_dtype"),
    ).transformation()
