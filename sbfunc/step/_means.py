"""The step's objective: the mean loss a step differentiates, over rows or over tokens.

With a loss over tokens (:class:`sbfunc.module.TokenLosses`) the default objective is Hugging
Face's, the mean over every real token of the batch: ``sum_i w_i sum_t a_it l_it / sum_it
a_it``, with ``w`` the rows' weights (a selection's, or 1) and ``a`` the token weights (1 for a
real token, 0 for padding; a token selection sets its own). ``objective="rows"`` is the mean of
the rows' means, :func:`masked_mean`, which is also the objective of every loss with one value
per row. Rows the step left out (a non-finite input or loss) weigh 0 either way.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch

from sbfunc._gradients import check_losses, weighted_mean
from sbfunc.engine import Context
from sbfunc.module import TokenLosses

__all__ = [
    "Backpropagated",
    "Before",
    "ObjectiveKind",
    "backpropagated",
    "count_tokens",
    "masked_mean",
    "start",
    "token_mean",
]

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
