"""Token-level selection, selective language modeling (Rho-1): the training forward scores
every token, and only the kept tokens' loss is backpropagated."""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from collections.abc import Callable
from typing import Any, Literal

import torch

from sbfunc import random as sbrandom
from sbfunc._tracing import host_readable
from sbfunc.engine import Algorithm, Context, Event
from sbfunc.select import ascending_order
from sbfunc.selective_backprop._reference import Reference, ReferenceState
from sbfunc.selective_backprop._window import check_window
from sbfunc.validation import check_choice, check_fraction

__all__ = ["TokenSelection", "kept_tokens"]

Keep = float | Callable[[Any], Any]
"""A kept fraction in (0, 1], or a schedule ``elapsed -> fraction`` of the fraction of
training done (a 0-d tensor inside a step: use tensor ops, ``torch.clamp``, not ``min``)."""

Score = Literal["excess", "loss", "uniform"]
"""What ranks the tokens: the excess loss over a reference's, the loss itself, or nothing
(uniform token dropping, the honest baseline at the same fraction)."""


def kept_tokens(
    scores: torch.Tensor, real: torch.Tensor, keep: float | torch.Tensor, key: sbrandom.Key
) -> torch.Tensor:
    """``bool [N, T...]``: the ``k = max(1, floor(keep * n))`` real tokens of highest score
    among the ``n`` real tokens of the batch (none where ``real`` is false), ties broken at
    random by ``key``; tokens of non-finite score rank last. Fixed shapes, no host read.

    Example:
        >>> scores = torch.tensor([[3.0, 1.0, 0.0], [2.0, 9.0, 5.0]])
        >>> real = torch.tensor([[True, True, False], [True, False, True]])
        >>> kept_tokens(scores, real, 0.5, sbfunc.random.key(0))
        tensor([[ True, False, False],
                [False, False,  True]])
    """
    flat = torch.where(real, scores, scores.new_full((), -torch.inf)).reshape(-1)
    order = _distinct_order(flat)  # eagerly on the CPU, when no two real scores tie
    if order is None:  # ties broken by the key (packed with the scores: one sort)
        order = ascending_order(flat, sbrandom.bits(key, flat.shape, device=flat.device))
    rank = torch.empty_like(order)  # 0 for the lowest
    rank[order] = torch.arange(flat.shape[0], device=flat.device)
    n = real.sum()
    # in float64, as Python's floor(keep * n) of the row selections (float32 rounds up)
    k = torch.clamp(torch.floor(n.to(torch.float64) * keep), min=1).to(rank.dtype)
    from_top = flat.shape[0] - 1 - rank
    return ((from_top < k) & real.reshape(-1)).reshape(real.shape)


def _distinct_order(flat: torch.Tensor) -> torch.Tensor | None:
    """The ascending order of ``flat`` when no two real scores tie, read on the host where
    that is free (eager, on the CPU): the ``-inf`` of the tokens that are not real may tie
    among themselves (they rank lowest, never kept), the rest must be finite and strictly
    increasing. The key's noise could not change such an order's kept tokens, so none is
    drawn (as :func:`sbfunc.select.distinct_order` does for rows); ``None`` otherwise."""
    if not (flat.dtype.is_floating_point and host_readable(flat)):
        return None
    values, order = torch.topk(flat, flat.shape[0], largest=False)  # ascending
    v = values.tolist()
    start = bisect.bisect_right(v, -math.inf)  # past the tokens that are not real
    real = v[start:]
    if real and not (math.isfinite(real[0]) and math.isfinite(real[-1])):
        return None
    return order if all(map(operator.lt, real, itertools.islice(real, 1, None))) else None


class TokenSelection(Algorithm):
    """Selective language modeling: on ``AFTER_LOSS``, keep the top ``keep`` fraction of the
    batch's real tokens by score and backpropagate the mean loss over the kept tokens only.

    One forward: the scores are the training forward's own token losses
    (``Context.token_losses``), minus a reference's (``score="excess"``, Rho-1's excess loss),
    as they are (``"loss"``), or random (``"uniform"``: uniform token dropping, the baseline at
    the same fraction). The whole sequence still goes forward; the selection sets
    ``Context.token_weights`` (a mask, fixed shapes), so it compiles with ``fullgraph=True`` and
    reads nothing on the host. It needs a loss over tokens and the step's ``"tokens"``
    objective (:func:`sbfunc.make_train_step`); data-parallel, each rank selects from its own
    batch (the fraction holds on every rank). Rows the step left out (a stand-in for a row
    without a real token, a non-finite row) have no real token here: they are never ranked,
    kept or counted. With microbatches the selection is over the whole batch's real tokens,
    whatever the split: the step scores every chunk in a forward without gradients first
    (one more forward per chunk), selects once, then trains each chunk on its kept tokens.

    Args:
        keep: the kept fraction of real tokens, in (0, 1], or a schedule ``elapsed ->
            fraction`` (see :data:`Keep`; e.g. keep everything early, then drop).
        reference: where the reference's token losses come from
            (:func:`~sbfunc.selective_backprop.reference_model`, or
            :func:`~sbfunc.selective_backprop.reference_field` for a table streamed with the
            batches); required with ``score="excess"``.
        score: ``"excess"`` (default), ``"loss"`` or ``"uniform"``.
        start: fraction of training at which selection starts (before: every token).
        end: fraction at which it ends.
        name: the name in traces (default ``"TokenSelection"``).

    Raises:
        TypeError: for an argument of the wrong type.
        ValueError: for a fraction out of range, ``score="excess"`` without a reference, or
            (in a step) a loss that is not over tokens.

    Example:
        >>> sel = sbfunc.selective_backprop.TokenSelection(0.6, score="loss")
        >>> ctx = sbfunc.Context(sbfunc.random.key(0),
        ...                      token_losses=torch.tensor([[2.0, 1.0], [0.5, 3.0]]),
        ...                      token_weights=torch.ones(2, 2))
        >>> sel.apply(sbfunc.Event.AFTER_LOSS, ctx).token_weights
        tensor([[1., 0.],
                [0., 1.]])

    References:
        Lin et al. 2024, "Rho-1: Not All Tokens Are What You Need" (NeurIPS; selective
        language modeling by excess loss over a reference model); Mindermann et al. 2022
        (RHO-LOSS, the reducible loss).
    """

    events = frozenset({Event.AFTER_LOSS})
    uses_elapsed = True
    selects_tokens = True

    def __init__(
        self,
        keep: Keep = 0.6,
        *,
        reference: Reference | None = None,
        score: Score = "excess",
        start: float = 0.0,
        end: float = 1.0,
        name: str | None = None,
    ) -> None:
        self.keep = keep if callable(keep) else check_fraction(keep, "keep", open_low=True)
        self.score = check_choice(score, "score", ("excess", "loss", "uniform"))
        if self.score == "excess" and reference is None:
            raise ValueError(
                "score='excess' needs a reference: pass reference=sbfunc.selective_backprop."
                "reference_model(...) or reference_field(...), or score='loss' / 'uniform'"
            )
        if reference is not None and not isinstance(reference, Reference):
            raise TypeError(
                "reference must be a Reference (init() and token_losses(ctx, state)): "
                "sbfunc.selective_backprop.reference_model(loss_fn, params, buffers) or "
                f"reference_field(field), got {type(reference).__name__}"
            )
        self.reference = reference
        check_window(start, end, 0)
        self.start, self.end = float(start), float(end)
        self.uses_elapsed = (self.start, self.end) != (0.0, 1.0) or callable(keep)
        if name is not None:
            self.name = name

    def init(self, key: Any) -> ReferenceState | None:
        """The reference model's tensors (a reference in the step), else nothing."""
        return None if self.reference is None else self.reference.init()

    def match(self, event: Event, ctx: Context) -> bool:
        return event == Event.AFTER_LOSS and self.start <= ctx.time.elapsed < self.end

    def apply(self, event: Event, ctx: Context) -> Context:
        if ctx.token_losses is None or ctx.token_weights is None:
            raise ValueError(
                f"{self.name} selects tokens: the step's loss must be over tokens (a token "
                "criterion such as sbfunc.module.next_token_cross_entropy) and its objective "
                "'tokens' (make_train_step's default)"
            )
        losses = ctx.token_losses.detach()
        score_key, tie_key = sbrandom.split(ctx.key)
        if self.score == "uniform":
            scores = sbrandom.uniform(score_key, tuple(losses.shape), device=losses.device)
        elif self.score == "loss":
            scores = losses
        else:
            assert self.reference is not None
            scores = losses - self.reference.token_losses(ctx, ctx.own).to(losses)
        keep = self.keep(ctx.time.elapsed) if callable(self.keep) else self.keep
        kept = kept_tokens(scores, ctx.token_weights > 0, keep, tie_key)
        return ctx.replace(token_weights=torch.where(kept, ctx.token_weights, 0.0))

    def __repr__(self) -> str:
        return f"TokenSelection(keep={self.keep!r}, score={self.score!r})"
