"""Dynamic loss scaling (``torch.amp.GradScaler``) as a gradient transformation:
:func:`dynamic_loss_scale`, its state :class:`LossScaleState`, and what the training step reads
from it (:func:`loss_scale`, :func:`unscale`, :func:`scales_loss`)."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import torch

from sbfunc._finite import all_finite
from sbfunc._tracing import replace_by_constructor
from sbfunc.optim._apply_if_finite import update_if
from sbfunc.optim._base import GradientTransformation, TransformRecord, by_group, zero_count
from sbfunc.types import Params
from sbfunc.validation import check_int, check_real

__all__ = [
    "LossScaleState",
    "dynamic_loss_scale",
    "loss_scale",
    "scales_loss",
    "state_on_skip",
    "unscale",
]


@replace_by_constructor  # its copies survive a compiled frame on torch 2.11
class LossScaleState(NamedTuple):
    """The state of :func:`dynamic_loss_scale` (checkpointable: tensors and the inner state).

    Attributes:
        scale: 0-d float32 tensor, the factor the training step multiplies the loss by
            (``GradScaler``'s ``_scale``).
        good_steps: 0-d int64 tensor, the finite updates since the scale last changed
            (``GradScaler``'s ``_growth_tracker``).
        inner: the wrapped transformation's state.

    Example:
        >>> from sbfunc import optim
        >>> optim.dynamic_loss_scale(optim.sgd(0.1)).init({"w": torch.ones(1)})
        LossScaleState(scale=tensor(65536.), good_steps=tensor(0), inner=EmptyState())

    References:
        PyTorch ``torch.amp.GradScaler`` (``_scale``, ``_growth_tracker``).
    """

    scale: torch.Tensor
    good_steps: torch.Tensor
    inner: Any


@dataclasses.dataclass(frozen=True, repr=False)
class _DynamicLossScale(TransformRecord):
    inner: GradientTransformation = dataclasses.field(repr=False)
    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000

    def init(self, params: Params) -> LossScaleState:
        good = zero_count(params)
        scale = torch.full((), self.init_scale, dtype=torch.float32, device=good.device)
        return LossScaleState(scale, good, self.inner.init(params))

    def next_scale(
        self, finite: torch.Tensor, state: LossScaleState
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scale, good_steps)`` after an update: GradScaler's ``_amp_update_scale_`` in
        tensor ops (backed off and reset on overflow; grown, when the grown scale is finite,
        and reset after ``growth_interval`` finite updates in a row)."""
        good = torch.where(finite, state.good_steps + 1, torch.zeros_like(state.good_steps))
        grown = state.scale * self.growth_factor
        grow = (good >= self.growth_interval) & torch.isfinite(grown)
        scale = torch.where(grow, grown, state.scale)
        scale = torch.where(finite, scale, state.scale * self.backoff_factor)
        good = torch.where(good >= self.growth_interval, torch.zeros_like(good), good)
        return scale, good

    def update(
        self, updates: Params, state: LossScaleState, params: Params | None = None
    ) -> tuple[Params, LossScaleState]:
        finite = all_finite(updates.values()).to(state.scale.device)
        out, inner = update_if(finite, self.inner, updates, state.inner, params, owner=self)
        scale, good = self.next_scale(finite, state)
        return out, LossScaleState(scale, good, inner)

    def __repr__(self) -> str:
        return f"dynamic_loss_scale({self.inner!r}, {super().__repr__()[len(self.name) + 1 :]}"


def dynamic_loss_scale(
    inner: GradientTransformation,
    *,
    init_scale: float = 2.0**16,
    growth_factor: float = 2.0,
    backoff_factor: float = 0.5,
    growth_interval: int = 2000,
) -> GradientTransformation:
    """Dynamic loss scaling for float16 training, ``torch.amp.GradScaler`` as a transformation.

    The training step (:func:`sbfunc.make_train_step`, with this as its optimizer) multiplies
    the differentiated loss by ``state.scale`` so small float16 gradients do not flush to zero,
    and divides the gradients by it right after the backward, so this ``update`` receives the
    true (unscaled) gradients, as do ``AFTER_BACKWARD`` algorithms and clipping. ``update``
    checks them in one fused kernel (:func:`all_finite`): when finite it runs ``inner`` and
    counts a good step, growing the scale by ``growth_factor`` after ``growth_interval`` good
    steps in a row; on an overflow it returns ``-0.0`` updates, leaves ``inner``'s state as it
    was and multiplies the scale by ``backoff_factor`` (as :func:`apply_if_finite`; the step
    counts the skip in ``metrics.skipped``). Tensor ops only: no host sync, one compiled graph.
    The defaults are GradScaler's. It must be the outermost transformation (the step reads
    the scale at the top of the optimizer state, :func:`loss_scale`); used outside a step it
    is :func:`apply_if_finite` with a scale to read.

    Args:
        inner: the optimizer, e.g. ``sbfunc.optim.adamw(1e-3)``.
        init_scale: the first scale, ``> 0`` (GradScaler: ``2.0**16``).
        growth_factor: the factor after ``growth_interval`` good steps, ``> 1``.
        backoff_factor: the factor after an overflow, in ``(0, 1)``.
        growth_interval: the good steps in a row before the scale grows, ``>= 1``.

    Returns:
        A :class:`GradientTransformation` with state :class:`LossScaleState`.

    Raises:
        TypeError: if ``inner`` is not a transformation or a factor is not a number.
        ValueError: for a factor out of its range.

    Example:
        >>> from sbfunc import optim
        >>> opt, params = optim.dynamic_loss_scale(optim.sgd(0.1)), {"w": torch.ones(2)}
        >>> updates, state = opt.update({"w": torch.tensor([1.0, float("inf")])}, opt.init(params))
        >>> updates["w"], state.scale
        (tensor([-0., -0.]), tensor(32768.))

    References:
        Micikevicius et al. 2018, "Mixed Precision Training" (loss scaling); PyTorch
        ``torch.amp.GradScaler``; DeepMind jmp ``DynamicLossScale``.
    """
    if not (callable(getattr(inner, "init", None)) and callable(getattr(inner, "update", None))):
        raise TypeError(f"inner must be a GradientTransformation, got {type(inner).__name__}")
    return _DynamicLossScale(
        name="dynamic_loss_scale",
        inner=inner,
        init_scale=check_real(init_scale, "init_scale", low=0.0, open_low=True),
        growth_factor=check_real(growth_factor, "growth_factor", low=1.0, open_low=True),
        backoff_factor=check_real(
            backoff_factor, "backoff_factor", low=0.0, high=1.0, open_low=True, open_high=True
        ),
        growth_interval=check_int(growth_interval, "growth_interval", low=1),
    ).transformation()


def scales_loss(optimizer: GradientTransformation) -> bool:
    """Whether ``optimizer`` is a :func:`dynamic_loss_scale` (its state a
    :class:`LossScaleState`)."""
    return isinstance(getattr(optimizer.update, "__self__", None), _DynamicLossScale)


def loss_scale(opt_state: Any) -> torch.Tensor | None:
    """The loss scale of an optimizer state: ``opt_state.scale`` for a :class:`LossScaleState`
    (the state of :func:`dynamic_loss_scale`), else ``None``.

    Example:
        >>> from sbfunc import optim
        >>> opt = optim.dynamic_loss_scale(optim.sgd(0.1), init_scale=1024.0)
        >>> optim.loss_scale(opt.init({"w": torch.ones(1)})), optim.loss_scale(())
        (tensor(1024.), None)
    """
    return opt_state.scale if isinstance(opt_state, LossScaleState) else None


def unscale(grads: Params, scale: torch.Tensor) -> Params:
    """``grads / scale``, one foreach division per (device, dtype) group, in the gradients'
    dtype (new tensors; the scale is not cast, so a float16 gradient is divided by a float32
    scale beyond float16's range)."""

    def divide(g: list[torch.Tensor]) -> tuple[list[torch.Tensor]]:
        return (list(torch._foreach_div(g, scale.to(g[0].device))),)

    return by_group(divide, grads)[0]


def state_on_skip(new: Any, old: Any) -> Any:
    """The optimizer state a skipped update keeps: ``old``, the state before it, except for
    :func:`dynamic_loss_scale`, which handles a non-finite update itself: its new state (the
    scale backed off on an overflow, which must persist or the scale never shrinks) with the
    inner optimizer's state from before.

    Example:
        >>> from sbfunc.optim import LossScaleState, state_on_skip
        >>> old, new = LossScaleState(torch.tensor(4.0), torch.tensor(7), "old"), "new"
        >>> state_on_skip(LossScaleState(torch.tensor(2.0), torch.tensor(0), new), old)
        LossScaleState(scale=tensor(2.), good_steps=tensor(0), inner='old')

    References:
        PyTorch ``torch.amp.GradScaler`` (a skipped step still updates the scale).
    """
    if isinstance(new, LossScaleState) and isinstance(old, LossScaleState):
        return new._replace(inner=old.inner)
    return old
