"""The differentiated part of a step: forward, ``AFTER_FORWARD``/``BEFORE_LOSS``, the loss,
``AFTER_LOSS``/``BEFORE_BACKWARD``, its gradient. Microbatching calls it once per chunk
(:mod:`sbfunc.step`).

The four events fire inside the differentiated function, so what an algorithm leaves there is
what is backpropagated (Composer's meaning): a new ``loss`` on ``AFTER_LOSS`` or
``BEFORE_BACKWARD`` is differentiated as it is; new per-sample ``losses`` or
``sample_weights`` are averaged again (:func:`masked_mean`). There ``loss`` and ``losses``
still carry their autograd history, so a loss built from them has the right gradient."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Literal, NamedTuple, cast

import torch

from sbfunc import random as sbrandom
from sbfunc._finite import finite_entries
from sbfunc._gradients import (
    check_losses,
    detach_tensors,
    differentiate,
    fresh_buffers,
    weighted_mean,
)
from sbfunc._tracing import host_flag
from sbfunc.batch import batch_size
from sbfunc.engine import Carry, Context, Event, Time
from sbfunc.module import ModuleLoss
from sbfunc.types import LossFn, Params, PerSample

__all__ = [
    "AUTOCAST",
    "INSIDE_EVENTS",
    "Fire",
    "Objective",
    "Precision",
    "backpropagated",
    "masked_mean",
]

INSIDE_EVENTS = (Event.AFTER_FORWARD, Event.BEFORE_LOSS, Event.AFTER_LOSS, Event.BEFORE_BACKWARD)
"""The events that fire inside the differentiated function."""

Fire = Callable[[Event, Carry], Carry]
"""``fire(event, carry) -> carry``: apply one event's planned algorithms."""

Precision = Literal["fp32", "amp_bf16", "amp_fp16"]
"""``make_train_step``'s ``precision`` values (Composer's ``precision=`` names)."""

AUTOCAST: dict[str, torch.dtype | None] = {
    "fp32": None,
    "amp_bf16": torch.bfloat16,
    "amp_fp16": torch.float16,
}
"""The ``torch.autocast`` dtype of each precision (``None``: no autocast)."""


def masked_mean(
    losses: torch.Tensor, weights: torch.Tensor | None, ok: torch.Tensor | None
) -> torch.Tensor:
    """The weighted mean loss over the rows where ``ok`` holds (every row when ``None``).

    Equal bit for bit to :func:`weighted_mean` when every row is ok (the correction factor is
    exactly 1); NaN when no row is.

    Example:
        >>> masked_mean(torch.tensor([1.0, float("nan"), 3.0]), None,
        ...             torch.tensor([True, False, True]))
        tensor(2.)
    """
    if ok is None:
        return weighted_mean(losses, weights)
    kept = torch.where(ok, losses, losses.new_zeros(()))
    n = ok.shape[0]
    return weighted_mean(kept, weights) * (n / ok.sum().to(losses.dtype))


def backpropagated(
    ctx: Context,
    before: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
    used: torch.Tensor | None,
    n: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss to differentiate and the per-sample losses, after ``AFTER_LOSS`` and
    ``BEFORE_BACKWARD`` left ``ctx``: a replaced ``loss`` as it is, else the mean of the
    (possibly replaced) ``losses`` under the (possibly replaced) ``sample_weights``, else
    ``loss`` unchanged. ``before`` is ``(loss, losses, sample_weights)`` as ``AFTER_LOSS``
    received them.

    Raises:
        ValueError: if a replaced ``loss`` is not a 0-d floating tensor, or replaced
            ``losses`` are not one per row.
    """
    loss, losses, weights = before
    if ctx.loss is not loss:
        new = ctx.loss
        if not isinstance(new, torch.Tensor) or new.dim() != 0 or not new.is_floating_point():
            got = tuple(new.shape) if isinstance(new, torch.Tensor) else type(new).__name__
            raise ValueError(
                "state.loss changed on AFTER_LOSS/BEFORE_BACKWARD must be a 0-d floating "
                f"tensor (what is backpropagated), got {got}"
            )
        return new, ctx.losses if ctx.losses is not None else losses
    if ctx.losses is not losses or ctx.sample_weights is not weights:
        new_losses = ctx.losses
        check_losses(new_losses, n)
        assert isinstance(new_losses, torch.Tensor)  # check_losses raised otherwise
        return masked_mean(new_losses, ctx.sample_weights, used), new_losses
    return loss, losses


class Objective(NamedTuple):
    """How one step turns a batch into a loss and gradients.

    Attributes:
        loss_fn: the per-sample training loss (a :class:`~sbfunc.module.ModuleLoss` runs its
            forward and criterion apart, with ``AFTER_FORWARD``/``BEFORE_LOSS`` between).
        per_sample: the batch's per-sample spec.
        mask_nonfinite: leave rows whose loss is not finite out of the loss.
        autocast: run the forward and the loss under ``torch.autocast`` with this dtype
            (``make_train_step(precision=...)``); ``None``: as the parameters are.
    """

    loss_fn: LossFn
    per_sample: PerSample
    mask_nonfinite: bool
    autocast: torch.dtype | None = None

    def precision(self, params: Params) -> contextlib.AbstractContextManager[Any]:
        """The forward's and the loss's precision: ``torch.autocast`` on the parameters'
        device type (the CPU for none), or nothing."""
        if self.autocast is None:
            return contextlib.nullcontext()
        device = next(iter(params.values())).device.type if params else "cpu"
        return torch.autocast(device, dtype=self.autocast)

    def rows_used(self, losses: torch.Tensor, ok: torch.Tensor | None) -> torch.Tensor | None:
        """The rows the loss averages: inputs (``ok``) and loss finite; ``None``: all (or
        not masking). Eagerly the loss's finiteness is read only when needed."""
        if not self.mask_nonfinite:
            return ok
        finite = finite_entries(losses.detach())
        if ok is not None or not host_flag(finite.all()):
            return finite if ok is None else ok & finite
        return None

    def __call__(
        self,
        carry: Carry,
        fire: Fire,
        *,
        inside: bool,
        model_key: torch.Tensor | None,
        ok: torch.Tensor | None,
        scale: torch.Tensor | None = None,
    ) -> tuple[Carry, Params, torch.Tensor, torch.Tensor | None]:
        """Forward, loss and gradient of the carried batch.

        Args:
            carry: the carry after ``BEFORE_FORWARD``.
            fire: applies ``AFTER_FORWARD`` ... ``BEFORE_BACKWARD``.
            inside: whether any algorithm runs on those four events (their outputs may then
                carry autograd history eagerly and are detached).
            model_key: the key of the model's random operations, or ``None``.
            ok: the rows whose inputs are finite (``None``: all).
            scale: the loss scale (:func:`sbfunc.optim.dynamic_loss_scale`): the gradients
                are those of ``loss * scale``; the loss returned is not scaled.

        Returns:
            ``(carry, grads, loss, ok)``: the carry after ``BEFORE_BACKWARD`` with the
            backpropagated ``loss``, detached ``losses``, ``outputs`` and new ``buffers``; the
            gradients (scaled as the loss); the loss; the rows the loss used (inputs and loss
            finite), or ``None`` when not masking.
        """
        loss_fn, staged = self.loss_fn, isinstance(self.loss_fn, ModuleLoss)
        context = carry.context
        buffers, time = context.buffers, context.time

        def randomness() -> contextlib.AbstractContextManager[Any]:
            return contextlib.nullcontext() if model_key is None else sbrandom.keyed(model_key)

        def objective(
            p: Params,
        ) -> tuple[torch.Tensor, tuple[Params, Carry, torch.Tensor, Any, Any]]:
            b, c = fresh_buffers(buffers), carry
            if staged:
                assert isinstance(loss_fn, ModuleLoss)
                with randomness(), self.precision(p):
                    outputs = loss_fn.forward(p, b, c.context.batch)
                c = c._replace(context=c.context._replace(outputs=outputs))
            c = fire(Event.AFTER_FORWARD, c)
            c = fire(Event.BEFORE_LOSS, c)
            ctx = c.context
            if staged:
                assert isinstance(loss_fn, ModuleLoss)
                with self.precision(p):
                    losses = loss_fn.criterion(ctx.outputs, ctx.batch)
            else:
                with randomness(), self.precision(p):
                    losses = loss_fn(p, b, ctx.batch)
            n = batch_size(ctx.batch, per_sample=self.per_sample)
            check_losses(losses, n)
            used = self.rows_used(losses, ok)
            before = (masked_mean(losses, ctx.sample_weights, used), losses, ctx.sample_weights)
            c = c._replace(context=ctx._replace(loss=before[0], losses=losses))
            c = fire(Event.BEFORE_BACKWARD, fire(Event.AFTER_LOSS, c))
            ctx = c.context
            loss, losses = backpropagated(ctx, before, used, n)
            # The time stays out of the aux: torch.func accepts tensor leaves only there, and
            # it goes back in unchanged below.
            c = c._replace(context=ctx._replace(time=cast(Time, None)))
            if scale is None:
                return loss, (b, c, losses, used, None)
            return loss * scale, (b, c, losses, used, loss)

        grads, loss, (new_buffers, carry, losses, used, unscaled) = differentiate(
            objective, context.params, detach_aux=False
        )
        if unscaled is not None:  # the loss, not the scaled one differentiated
            loss = unscaled.detach()
        # Eagerly the aux may carry autograd history: the outputs always, anything else only
        # when algorithms ran inside the objective (buffers update under no_grad).
        ctx = carry.context
        if inside:
            carry = detach_tensors(carry)
            ctx = carry.context
        outputs = detach_tensors(ctx.outputs) if staged else None
        ctx = ctx._replace(
            buffers=new_buffers, loss=loss, losses=losses.detach(), time=time, outputs=outputs
        )
        return carry._replace(context=ctx), grads, loss, used
