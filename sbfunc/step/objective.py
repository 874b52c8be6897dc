"""The differentiated part of a step: forward, ``AFTER_FORWARD``/``BEFORE_LOSS``, the loss, its
gradient. Microbatching calls it once per chunk (:mod:`sbfunc.step.microbatch`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import torch

from sbfunc import random as sbrandom
from sbfunc.batch import PerSample, batch_size
from sbfunc.engine import Carry, Event, Time
from sbfunc.module import LossFn, ModuleLoss, Params
from sbfunc.optim._finite import host_flag
from sbfunc.step.gradients import (
    check_losses,
    detach_tensors,
    differentiate,
    fresh_buffers,
    weighted_mean,
)

__all__ = ["Fire", "Objective", "masked_mean"]

Fire = Callable[[Event, Carry], Carry]
"""``fire(event, carry) -> carry``: apply one event's planned algorithms."""


def masked_mean(
    losses: torch.Tensor, weights: torch.Tensor | None, ok: torch.Tensor | None
) -> torch.Tensor:
    """The weighted mean loss over the rows where ``ok`` holds (every row when ``None``).

    Equal bit for bit to :func:`weighted_mean` when every row is ok (the correction factor is
    exactly 1); NaN when no row is.

    Example:
        >>> from sbfunc.step.objective import masked_mean
        >>> masked_mean(torch.tensor([1.0, float("nan"), 3.0]), None,
        ...             torch.tensor([True, False, True]))
        tensor(2.)
    """
    if ok is None:
        return weighted_mean(losses, weights)
    kept = torch.where(ok, losses, losses.new_zeros(()))
    n = ok.shape[0]
    return weighted_mean(kept, weights) * (n / ok.sum().to(losses.dtype))


class Objective(NamedTuple):
    """How one step turns a batch into a loss and gradients.

    Attributes:
        loss_fn: the per-sample training loss (a :class:`~sbfunc.ModuleLoss` runs its
            forward and criterion apart, with ``AFTER_FORWARD``/``BEFORE_LOSS`` between).
        per_sample: the batch's per-sample spec.
        mask_nonfinite: leave rows whose loss is not finite out of the loss.
    """

    loss_fn: LossFn
    per_sample: PerSample
    mask_nonfinite: bool

    def __call__(
        self,
        carry: Carry,
        fire: Fire,
        *,
        inside: bool,
        model_key: torch.Tensor | None,
        ok: torch.Tensor | None,
    ) -> tuple[Carry, Params, torch.Tensor, torch.Tensor | None]:
        """Forward, loss and gradient of the carried batch.

        Args:
            carry: the carry after ``BEFORE_FORWARD``.
            fire: applies ``AFTER_FORWARD`` and ``BEFORE_LOSS``.
            inside: whether any algorithm runs on those two events (their outputs may then
                carry autograd history eagerly and are detached).
            model_key: the key of the model's random operations, or ``None``.
            ok: the rows whose inputs are finite (``None``: all).

        Returns:
            ``(carry, grads, loss, ok)``: the carry with ``loss``, detached ``losses``,
            ``outputs`` and new ``buffers``; the gradients; the loss; the rows the loss used
            (inputs and loss finite), or ``None`` when not masking.
        """
        loss_fn, staged = self.loss_fn, isinstance(self.loss_fn, ModuleLoss)
        context = carry.context
        buffers, time = context.buffers, context.time

        def randomness() -> contextlib.AbstractContextManager[Any]:
            return contextlib.nullcontext() if model_key is None else sbrandom.keyed(model_key)

        def objective(p: Params) -> tuple[torch.Tensor, tuple[Params, Carry, torch.Tensor, Any]]:
            b, c = fresh_buffers(buffers), carry
            if staged:
                assert isinstance(loss_fn, ModuleLoss)
                with randomness():
                    outputs = loss_fn.forward(p, b, c.context.batch)
                c = c._replace(context=c.context._replace(outputs=outputs))
            c = fire(Event.AFTER_FORWARD, c)
            c = fire(Event.BEFORE_LOSS, c)
            ctx = c.context
            if staged:
                assert isinstance(loss_fn, ModuleLoss)
                losses = loss_fn.criterion(ctx.outputs, ctx.batch)
            else:
                with randomness():
                    losses = loss_fn(p, b, ctx.batch)
            check_losses(losses, batch_size(ctx.batch, per_sample=self.per_sample))
            used = ok
            if self.mask_nonfinite:
                finite = torch.isfinite(losses.detach())
                if ok is not None or not host_flag(finite.all()):  # eagerly: only when needed
                    used = finite if ok is None else ok & finite
            loss = masked_mean(losses, ctx.sample_weights, used)
            # The time stays out of the aux: torch.func accepts tensor leaves only there, and
            # it goes back in unchanged below.
            c = c._replace(context=ctx._replace(time=cast(Time, None)))
            return loss, (b, c, losses, used)

        grads, loss, (new_buffers, carry, losses, used) = differentiate(
            objective, context.params, detach_aux=False
        )
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
