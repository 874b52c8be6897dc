"""The differentiated part of a step: forward, ``AFTER_FORWARD``/``BEFORE_LOSS``, the loss,
``AFTER_LOSS``/``BEFORE_BACKWARD``, its gradient. Microbatching calls it once per chunk
(:mod:`sbfunc.step`).

The four events fire inside the differentiated function, so what an algorithm leaves there is
what is backpropagated (Composer's meaning): a new ``loss`` on ``AFTER_LOSS`` or
``BEFORE_BACKWARD`` is differentiated as it is; new per-sample ``losses`` or
``sample_weights`` are averaged again (:func:`masked_mean`). There ``loss`` and ``losses``
still carry their autograd history, so a loss built from them has the right gradient.

**The mean it differentiates.** With a loss over tokens (:class:`sbfunc.module.TokenLosses`)
the default objective is Hugging Face's, the mean over every real token of the batch:
``sum_i w_i sum_t a_it l_it / sum_it a_it``, with ``w`` the rows' weights (a selection's, or
1) and ``a`` the token weights (1 for a real token, 0 for padding; a token selection sets its
own). ``objective="rows"`` is the mean of the rows' means, :func:`masked_mean`, which is also
the objective of every loss with one value per row. Rows the step left out (a non-finite input
or loss) weigh 0 either way."""

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
from sbfunc._tracing import host_flag, tracing
from sbfunc.batch import batch_size
from sbfunc.engine import Context, Event, Time
from sbfunc.engine.internal import Carry
from sbfunc.module import ModuleLoss, TokenLosses, reduce_per_sample
from sbfunc.types import LossFn, Params, PerSample

__all__ = [
    "AUTOCAST",
    "INSIDE_EVENTS",
    "Backpropagated",
    "Before",
    "Differentiated",
    "Fire",
    "Objective",
    "ObjectiveKind",
    "Precision",
    "backpropagated",
    "count_tokens",
    "masked_mean",
    "start",
    "token_mean",
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


ObjectiveKind = Literal["tokens", "rows"]
"""``make_train_step``'s ``objective`` values."""


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


def token_mean(
    losses: torch.Tensor,
    token_weights: torch.Tensor,
    weights: torch.Tensor | None,
    ok: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mean, denominator)``: the weighted mean of the token ``losses`` ``[N, T...]`` under
    ``token_weights`` (0 where a token does not count) and the rows' ``weights``, over the rows
    where ``ok`` holds; the denominator is the tokens' total weight (0: the mean is NaN).

    A token whose weight is 0 is never read (a select, so a NaN there is harmless).

    Example:
        >>> losses = torch.tensor([[1.0, 3.0], [2.0, float("nan")]])
        >>> token_mean(losses, torch.tensor([[1.0, 1.0], [1.0, 0.0]]), None, None)
        (tensor(2.), tensor(3.))
    """
    a = token_weights.to(losses.dtype)
    if ok is not None:
        a = torch.where(ok.reshape(-1, *[1] * (a.dim() - 1)), a, a.new_zeros(()))
    counted = torch.where(a != 0, losses, losses.new_zeros(())) * a
    rows = counted.flatten(1).sum(1)
    if weights is not None:
        rows = rows * weights.to(rows.dtype)
    denominator = a.sum()
    return rows.sum() / denominator, denominator


class Before(NamedTuple):
    """What ``AFTER_LOSS`` received: the loss, the per-row losses and weights, and for a loss
    over tokens the token losses and weights (``None`` otherwise)."""

    loss: torch.Tensor
    losses: torch.Tensor
    weights: torch.Tensor | None
    token_losses: torch.Tensor | None = None
    token_weights: torch.Tensor | None = None
    denominator: torch.Tensor | None = None


def start(
    losses: torch.Tensor,
    tokens: TokenLosses | None,
    weights: torch.Tensor | None,
    used: torch.Tensor | None,
) -> Before:
    """What ``AFTER_LOSS`` receives: the objective of the rows' ``losses`` (and of ``tokens``,
    when the objective is over tokens) under the rows' ``weights``, over the ``used`` rows.
    The token weights are 0 on every token of a row left out (a stand-in for a row without a
    real token, a non-finite row), so a token selection never ranks, keeps or counts them."""
    if tokens is None:
        return Before(masked_mean(losses, weights, used), losses, weights)
    real = tokens.mask
    if used is not None:  # a left-out row's tokens (a stand-in's) are not real: never ranked
        real = real & used.reshape(-1, *[1] * (real.dim() - 1))
    token_weights = real.to(tokens.losses.dtype)
    loss, denominator = token_mean(tokens.losses, token_weights, weights, used)
    return Before(loss, losses, weights, tokens.losses, token_weights, denominator)


class Backpropagated(NamedTuple):
    """What :func:`backpropagated` decided: the loss to differentiate, the per-row losses, the
    token mean's denominator (by which microbatches combine; ``None`` for a mean over rows)
    and the number of tokens that mean averaged (``int64``; ``None`` for a mean over rows)."""

    loss: torch.Tensor
    losses: torch.Tensor
    denominator: torch.Tensor | None = None
    tokens: torch.Tensor | None = None


def count_tokens(token_weights: torch.Tensor, ok: torch.Tensor | None) -> torch.Tensor:
    """The tokens of nonzero weight in the rows where ``ok`` holds: a 0-d ``int64`` tensor.

    Example:
        >>> count_tokens(torch.tensor([[1.0, 0.0], [1.0, 1.0]]), torch.tensor([True, False]))
        tensor(1)
    """
    nonzero = token_weights != 0
    if ok is not None:
        nonzero = nonzero & ok.reshape(-1, *[1] * (nonzero.dim() - 1))
    return nonzero.sum()


def backpropagated(
    ctx: Context, before: Before, used: torch.Tensor | None, n: int
) -> Backpropagated:
    """The loss to differentiate and the per-sample losses, after ``AFTER_LOSS`` and
    ``BEFORE_BACKWARD`` left ``ctx``: a replaced ``loss`` as it is; else, for a loss over
    tokens whose token losses or weights (or row weights) changed, their :func:`token_mean`;
    else the mean of the (possibly replaced) ``losses`` under the (possibly replaced)
    ``sample_weights``; else ``loss`` unchanged (see :class:`Backpropagated`).

    Raises:
        ValueError: if a replaced ``loss`` is not a 0-d floating tensor, replaced ``losses``
            are not one per row, or replaced token losses or weights are not the shape of the
            token losses.
    """
    if ctx.loss is not before.loss:
        new = ctx.loss
        if not isinstance(new, torch.Tensor) or new.dim() != 0 or not new.is_floating_point():
            got = tuple(new.shape) if isinstance(new, torch.Tensor) else type(new).__name__
            raise ValueError(
                "ctx.loss changed on AFTER_LOSS/BEFORE_BACKWARD must be a 0-d floating tensor "
                f"(what is backpropagated), got {got}"
            )
        return Backpropagated(new, ctx.losses if ctx.losses is not None else before.losses)
    if before.token_losses is not None and (
        ctx.token_losses is not before.token_losses
        or ctx.token_weights is not before.token_weights
        or ctx.sample_weights is not before.weights
    ):
        tokens, weights = _checked_tokens(ctx, before)
        loss, denominator = token_mean(tokens, weights, ctx.sample_weights, used)
        return Backpropagated(loss, before.losses, denominator, count_tokens(weights, used))
    if ctx.losses is not before.losses or ctx.sample_weights is not before.weights:
        new_losses = ctx.losses
        check_losses(new_losses, n)
        assert isinstance(new_losses, torch.Tensor)  # check_losses raised otherwise
        return Backpropagated(masked_mean(new_losses, ctx.sample_weights, used), new_losses)
    real = before.token_weights  # zero on the rows left out already
    count = None if real is None else count_tokens(real, None)
    return Backpropagated(before.loss, before.losses, before.denominator, count)


def _checked_tokens(ctx: Context, before: Before) -> tuple[torch.Tensor, torch.Tensor]:
    assert before.token_losses is not None and before.token_weights is not None
    shape = before.token_losses.shape
    for name, value in (("token_losses", ctx.token_losses), ("token_weights", ctx.token_weights)):
        if not isinstance(value, torch.Tensor) or value.shape != shape:
            got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(
                f"ctx.{name} changed on AFTER_LOSS/BEFORE_BACKWARD must keep the token losses' "
                f"shape {tuple(shape)}, got {got}"
            )
    assert ctx.token_losses is not None and ctx.token_weights is not None
    return ctx.token_losses, ctx.token_weights


class Objective(NamedTuple):
    """How one step turns a batch into a loss and gradients.

    Attributes:
        loss_fn: the per-sample training loss (a :class:`~sbfunc.module.ModuleLoss` runs its
            forward and criterion apart, with ``AFTER_FORWARD``/``BEFORE_LOSS`` between).
        per_sample: the batch's per-sample spec.
        mask_nonfinite: leave rows whose loss is not finite out of the loss.
        autocast: run the forward and the loss under ``torch.autocast`` with this dtype
            (``make_train_step(precision=...)``); ``None``: as the parameters are.
        kind: ``"tokens"`` (a loss over tokens averages every real token of the batch) or
            ``"rows"`` (the mean of the rows' means); see the module docs.
        constants: the names of the buffers no forward writes (frozen parameters): the
            forward gets them as they are, not copies.
    """

    loss_fn: LossFn
    per_sample: PerSample
    mask_nonfinite: bool
    autocast: torch.dtype | None = None
    kind: ObjectiveKind = "tokens"
    constants: frozenset[str] = frozenset()

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
        token_weights: torch.Tensor | None = None,
    ) -> Differentiated:
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
            token_weights: the token weights ``AFTER_LOSS`` sees, decided already (a token
                selection made on the whole batch of a microbatched step); ``None``: every
                real token of the used rows.

        Returns:
            A :class:`Differentiated`.
        """
        context, carry_in = carry.context, carry
        buffers, time = context.buffers, context.time

        def objective(p: Params) -> tuple[torch.Tensor, tuple[Any, ...]]:
            b = fresh_buffers(buffers, self.constants)
            c, losses, tokens = self._losses(p, b, carry, fire, model_key)
            n = batch_size(c.context.batch, per_sample=self.per_sample)
            check_losses(losses, n)
            used = self.rows_used(losses, ok)
            before = start(losses, tokens, c.context.sample_weights, used)
            ctx = c.context._replace(
                loss=before.loss,
                losses=losses,
                token_losses=before.token_losses,
                token_weights=before.token_weights if token_weights is None else token_weights,
            )
            c = fire(Event.BEFORE_BACKWARD, fire(Event.AFTER_LOSS, c._replace(context=ctx)))
            out = backpropagated(c.context, before, used, n)
            # The time stays out of the aux: torch.func accepts tensor leaves only there, and
            # it goes back in unchanged below.
            c = c._replace(context=c.context._replace(time=cast(Time, None)))
            aux = (b, c, out.losses, used, out.denominator, out.tokens)
            loss = out.loss
            return (loss, (*aux, None)) if scale is None else (loss * scale, (*aux, loss))

        grads, loss, (new_buffers, carry, losses, used, weight, tokens, unscaled) = differentiate(
            objective, context.params, detach_aux=False
        )
        if unscaled is not None:  # the loss, not the scaled one differentiated
            loss = unscaled.detach()
        return Differentiated(
            self._detached(carry, carry_in if inside else None, new_buffers, loss, losses, time),
            grads,
            loss,
            used,
            weight,
            tokens,
        )

    def token_scores(
        self, carry: Carry, fire: Fire, *, model_key: torch.Tensor | None, ok: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Without gradients: the carried batch's token losses and weights as ``AFTER_LOSS``
        would see them (the forward, ``AFTER_FORWARD`` and ``BEFORE_LOSS`` run on copies: no
        state, buffer or trace of this pass is kept); ``(None, None)`` for a loss that is not
        over tokens or the ``"rows"`` objective."""
        context = carry.context
        with torch.no_grad():
            b = fresh_buffers(context.buffers, self.constants)
            c, losses, tokens = self._losses(context.params, b, carry, fire, model_key)
            if tokens is None:
                return None, None
            before = start(losses, tokens, c.context.sample_weights, self.rows_used(losses, ok))
        return before.token_losses, before.token_weights

    def _losses(
        self,
        p: Params,
        b: Params,
        carry: Carry,
        fire: Fire,
        model_key: torch.Tensor | None,
    ) -> tuple[Carry, torch.Tensor, TokenLosses | None]:
        """The forward, ``AFTER_FORWARD``/``BEFORE_LOSS``, then the rows' losses and, for a
        loss over tokens under the ``"tokens"`` objective, the token losses."""
        loss_fn = self.loss_fn

        def randomness() -> contextlib.AbstractContextManager[Any]:
            return contextlib.nullcontext() if model_key is None else sbrandom.keyed(model_key)

        if not isinstance(loss_fn, ModuleLoss):
            c = fire(Event.BEFORE_LOSS, fire(Event.AFTER_FORWARD, carry))
            with randomness(), self.precision(p):
                return c, loss_fn(p, b, c.context.batch), None
        with randomness(), self.precision(p):
            outputs = loss_fn.forward(p, b, carry.context.batch)
        c = carry._replace(context=carry.context._replace(outputs=outputs))
        c = fire(Event.BEFORE_LOSS, fire(Event.AFTER_FORWARD, c))
        with self.precision(p):
            elements = loss_fn.elements(c.context.outputs, c.context.batch)
        if not isinstance(elements, TokenLosses):
            n = c.context.outputs.shape[0] if isinstance(c.context.outputs, torch.Tensor) else None
            return c, reduce_per_sample(elements, n), None
        tokens = elements if self.kind == "tokens" else None
        return c, elements.row_means(), tokens

    def _detached(
        self,
        carry: Carry,
        start: Carry | None,
        buffers: Params,
        loss: torch.Tensor,
        losses: torch.Tensor,
        time: Time,
    ) -> Carry:
        """The carry after the objective, detached: eagerly the aux may carry autograd
        history, the outputs always, and, when algorithms ran inside the objective (``start``:
        the carry they started from), whatever they changed (buffers update under no_grad)."""
        if start is not None and not tracing():  # traced, torch.func detached the aux
            carry = _changes_detached(carry, start)
        ctx = carry.context
        staged = isinstance(self.loss_fn, ModuleLoss)
        ctx = ctx._replace(
            buffers=buffers,
            loss=loss,
            losses=losses.detach(),
            time=time,
            outputs=detach_tensors(ctx.outputs) if staged else None,
            token_losses=None,
            token_weights=None,
        )
        return carry._replace(context=ctx)


def _changes_detached(carry: Carry, start: Carry) -> Carry:
    """``carry`` with every value the algorithms inside the objective changed from ``start``
    detached: the batch, the weights, the focused ``own``/``scratch``, and the states and
    scratches they replaced. What they left alone is what the step started with, which has no
    autograd history: it is not walked (a state may hold a whole reference model)."""

    def fresh(new: Any, old: Any) -> Any:
        return new if new is old else detach_tensors(new)

    ctx, old = carry.context, start.context
    ctx = ctx._replace(
        batch=fresh(ctx.batch, old.batch),
        sample_weights=fresh(ctx.sample_weights, old.sample_weights),
        own=fresh(ctx.own, old.own),
        scratch=fresh(ctx.scratch, old.scratch),
    )
    states = tuple(map(fresh, carry.algorithm_state, start.algorithm_state))
    scratch = tuple(map(fresh, carry.scratch, start.scratch))
    return carry._replace(context=ctx, algorithm_state=states, scratch=scratch)


class Differentiated(NamedTuple):
    """What :class:`Objective` returns for one batch (or one microbatch).

    Attributes:
        carry: the carry after ``BEFORE_BACKWARD``, with the backpropagated ``loss``, the
            detached ``losses`` and ``outputs`` and the new ``buffers``.
        grads: the gradients (scaled as the loss).
        loss: the loss.
        used: the rows the loss used (inputs and loss finite), or ``None`` when not masking.
        weight: the token mean's denominator (the weight of the tokens it averaged), by which
            microbatches combine; ``None`` for a mean over rows.
        tokens: the number of tokens the token mean averaged (0-d ``int64``); ``None`` for
            a mean over rows.
    """

    carry: Carry
    grads: Params
    loss: torch.Tensor
    used: torch.Tensor | None
    weight: torch.Tensor | None
    tokens: torch.Tensor | None = None
