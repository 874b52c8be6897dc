"""Gradient accumulation as a wrapper: :func:`multi_steps` applies the inner transformation
once every ``k`` gradients (optax's ``MultiSteps``)."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import torch

from sbfunc._finite import keep_if_finite
from sbfunc._tracing import host_flag, replace_by_constructor
from sbfunc.optim._apply_if_finite import negative_zeros, skipped_updates
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
from sbfunc.optim._masking import check_transformation
from sbfunc.optim._skip import ShouldSkipUpdateFn, check_skip_flag
from sbfunc.types import Params
from sbfunc.validation import check_bool, check_callable, check_int

__all__ = ["ItemsState", "MultiStepsState", "multi_steps", "takes_items"]


@replace_by_constructor  # its copies survive a compiled frame on torch 2.11
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


class ItemsState(NamedTuple):
    """The state of :func:`multi_steps` with ``by_items=True``.

    Attributes:
        items: 0-d int64 tensor, the items (real tokens, rows) of the gradients accumulated
            since the last inner update.
        steps: the accumulation's :class:`MultiStepsState` (its ``acc_grads`` hold the sum of
            each gradient times its items).

    Example:
        >>> from sbfunc import optim
        >>> state = optim.multi_steps(optim.sgd(0.1), 2, by_items=True).init({"w": torch.ones(1)})
        >>> state.items, state.steps.mini_step
        (tensor(0), tensor(0))

    References:
        Hugging Face ``transformers`` ``Trainer`` (``num_items_in_batch``).
    """

    items: torch.Tensor
    steps: MultiStepsState


@dataclasses.dataclass(frozen=True, repr=False)
class _MultiSteps(TransformRecord):
    inner: GradientTransformation
    every_k: int
    use_mean: bool = True
    should_skip_update_fn: ShouldSkipUpdateFn | None = dataclasses.field(
        default=None, metadata=HIDDEN_UNSET
    )
    accumulator_dtype: torch.dtype | None = dataclasses.field(default=None, metadata=HIDDEN_UNSET)
    by_items: bool | None = dataclasses.field(default=None, metadata=HIDDEN_UNSET)  # None: off

    def init(self, params: Params) -> MultiStepsState | ItemsState:
        zero = zero_count(params)
        acc = negative_zeros(kept_in(self.accumulator_dtype, params))
        skip_state: Any = ()
        if self.should_skip_update_fn is not None:  # its state's structure, as optax
            zeros = {k: torch.zeros_like(p) for k, p in params.items()}
            _, skip_state = self.should_skip_update_fn(zeros, zero, params)
        steps = MultiStepsState(zero, zero.clone(), self.inner.init(params), acc, skip_state)
        return ItemsState(zero.clone(), steps) if self.by_items else steps

    def update(
        self,
        updates: Params,
        state: Any,
        params: Params | None = None,
        *,
        items: int | torch.Tensor | None = None,
    ) -> tuple[Params, Any]:
        if not self.by_items:
            if items is not None:
                raise ValueError(
                    "items= weighs the gradients of multi_steps(..., by_items=True); this "
                    "multi_steps averages the batches' gradients (by_items=False)"
                )
            return self.step(updates, state, params, None)
        n = _checked_items(items, state.items)
        weighted = {k: g * n.to(g.dtype) for k, g in updates.items()}  # the sum's gradient
        total = state.items + n
        out, steps = self.step(weighted, state.steps, params, total)
        emitted = steps.gradient_step != state.steps.gradient_step
        taken = emitted | (steps.mini_step != state.steps.mini_step)  # not skipped
        kept = torch.where(taken, total, state.items)
        return out, ItemsState(torch.where(emitted, torch.zeros_like(kept), kept), steps)

    def step(
        self,
        updates: Params,
        state: MultiStepsState,
        params: Params | None,
        items: torch.Tensor | None,
    ) -> tuple[Params, MultiStepsState]:
        """One call of the accumulation: skipped, accumulated, or the inner update on the
        mean (divided by ``items``, the accumulated items, when given)."""
        if self.should_skip_update_fn is None:
            return self.accumulate(updates, state, params, items)
        flag, skip_state = self.should_skip_update_fn(updates, state.gradient_step, params)
        skip = check_skip_flag(flag).to(state.mini_step.device)
        host = host_flag(skip)
        if host is True:  # eagerly on the CPU: the micro-step never happened
            like = (
                cast_like(updates, state.acc_grads) if self.accumulator_dtype is None else updates
            )
            out = skipped_updates(self, self.inner, like, state.inner_state, params)
            return out, state._replace(skip_state=skip_state)
        out, new = self.accumulate(updates, state, params, items)
        if host is None:
            out = {k: torch.where(skip, -0.0, u) for k, u in out.items()}
            new = keep_if_finite(~skip, new, state)
        return out, new._replace(skip_state=skip_state)

    def accumulate(
        self,
        updates: Params,
        state: MultiStepsState,
        params: Params | None,
        items: torch.Tensor | None = None,
    ) -> tuple[Params, MultiStepsState]:
        """Add ``updates`` to the accumulator; on the ``k``-th call, the inner update of the
        sum divided by ``k`` (``use_mean``) or by ``items``, when given."""
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
        if items is not None:  # by items: every item of the k batches weighs the same
            grads = {k: a / items.clamp_min(1).to(a.dtype) for k, a in acc.items()}
        elif self.use_mean and self.every_k > 1:
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
    by_items: bool = False,
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

    **By items** (``by_items=True``): each gradient is a mean over its batch's items (the
    real tokens of a token loss, the rows of a row loss), and batches hold different numbers
    of them (padding, prompts, token selection). The mean of the ``k`` batch means weighs a
    batch of 6 real tokens like one of 28; with ``by_items`` every item of the ``k`` batches
    weighs the same, as Hugging Face's ``num_items_in_batch`` does: ``update(g_i, state,
    params, items=n_i)`` accumulates ``n_i * g_i`` and the inner update gets
    ``sum_i n_i g_i / sum_i n_i``, the gradient of one step on the ``k`` batches together.
    :func:`sbfunc.make_train_step` passes each step's items itself (the step's
    ``tokens_backpropagated``, or its rows), so it must be the outermost transformation.

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
        by_items: weigh each gradient by its items (see above); ``update`` then takes
            ``items=``, an int or a 0-d integer tensor ``>= 0``.

    Returns:
        A :class:`GradientTransformation` with state :class:`MultiStepsState`, or
        :class:`ItemsState` with ``by_items``.

    Raises:
        TypeError: for arguments of the wrong type.
        ValueError: if ``every_k < 1``, or ``by_items`` with ``use_mean=False``; at
            ``update``, a ``should_skip`` that is not a 0-d bool tensor, or ``items``
            missing with ``by_items`` (or given without it).

    Example:
        >>> from sbfunc import optim
        >>> opt = optim.multi_steps(optim.sgd(1.0), 2)
        >>> state = opt.init({"w": torch.zeros(1)})
        >>> for g in (1.0, 3.0):
        ...     updates, state = opt.update({"w": torch.tensor([g])}, state)
        ...     print(updates["w"], state.gradient_step)
        tensor([-0.]) tensor(0)
        tensor([-2.]) tensor(1)

        By items, a batch of 3 items and one of 1 (the mean over the 4 items):

        >>> opt = optim.multi_steps(optim.sgd(1.0), 2, by_items=True)
        >>> state = opt.init({"w": torch.zeros(1)})
        >>> for g, n in ((1.0, 3), (5.0, 1)):
        ...     updates, state = opt.update({"w": torch.tensor([g])}, state, items=n)
        >>> updates["w"]
        tensor([-2.])

    References:
        DeepMind optax ``MultiSteps``; MosaicML Composer's gradient accumulation
        (``device_train_microbatch_size``); Hugging Face ``transformers`` ``Trainer``
        (``num_items_in_batch``: accumulation by tokens).
    """
    inner = check_transformation(inner, "inner")
    if should_skip_update_fn is not None:
        check_callable(should_skip_update_fn, "should_skip_update_fn")
    if check_bool(by_items, "by_items") and not use_mean:
        raise ValueError(
            "by_items=True averages over the items of the k batches; it takes use_mean=True "
            "(the default), got use_mean=False"
        )
    return _MultiSteps(
        name="multi_steps",
        inner=inner,
        every_k=check_int(every_k, "every_k", low=1),
        use_mean=check_bool(use_mean, "use_mean"),
        should_skip_update_fn=should_skip_update_fn,
        accumulator_dtype=check_dtype(accumulator_dtype, "accumulator_dtype"),
        by_items=by_items or None,  # shown in the repr only when set
    ).transformation()


def takes_items(optimizer: GradientTransformation) -> bool:
    """Whether ``optimizer`` is a :func:`multi_steps` with ``by_items=True`` (its ``update``
    takes ``items=``; :func:`sbfunc.make_train_step` passes them).

    Example:
        >>> from sbfunc import optim
        >>> optim.takes_items(optim.multi_steps(optim.sgd(0.1), 4, by_items=True))
        True
        >>> optim.takes_items(optim.multi_steps(optim.sgd(0.1), 4))
        False
    """
    record = getattr(optimizer.update, "__self__", None)
    return isinstance(record, _MultiSteps) and bool(record.by_items)


def _checked_items(items: int | torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """``items`` as a 0-d int64 tensor on ``like``'s device (checked from metadata only)."""
    if items is None:
        raise ValueError(
            "multi_steps(..., by_items=True).update needs items=, the number of items (real "
            "tokens, rows) the gradient averages; sbfunc.make_train_step passes it"
        )
    if isinstance(items, bool) or not isinstance(items, int | torch.Tensor):
        raise TypeError(f"items must be an int or a 0-d integer tensor, got {items!r}")
    if isinstance(items, int):
        if items < 0:
            raise ValueError(f"items must be >= 0, got {items}")
        return torch.tensor(items, dtype=torch.int64, device=like.device)
    if items.dim() != 0 or items.is_floating_point() or items.dtype == torch.bool:
        raise TypeError(
            f"items must be an int or a 0-d integer tensor, got a {items.dtype} tensor of "
            f"shape {tuple(items.shape)}"
        )
    return items.to(device=like.device, dtype=torch.int64)
