"""Diversified batch selection (DivBS) as a :class:`~sbfunc.policies.Policy`: keep the rows
whose last-layer gradients together best cover the batch's summed gradient
(:mod:`sbfunc.select.diverse`)."""

from __future__ import annotations

import torch

from sbfunc import random as sbrandom
from sbfunc.policies.base import EmptyState, Policy, SelectArgs, make_policy
from sbfunc.score.signals import Signals
from sbfunc.select import Selection, kept_count
from sbfunc.select.base import check_keep
from sbfunc.select.diverse import divbs_indices, gradient_gram, last_layer_errors
from sbfunc.select.samplers import top_k_indices

__all__ = ["divbs"]


def divbs(keep: float) -> Policy:
    """DivBS: the ``k = max(1, floor(keep*N))`` rows chosen greedily by orthogonalised
    representativeness of their last-layer gradients (:func:`~sbfunc.select.divbs_indices` on
    :func:`~sbfunc.select.gradient_gram` of :func:`~sbfunc.select.last_layer_errors` and the
    head's input features).

    Needs the signals ``logits``, ``features`` and ``targets`` (``Policy.needs``; Selective
    Backprop's scoring forward provides them) and reads the scores only for their finiteness:
    a row with a non-finite score counts as a zero gradient and is kept only when fewer than
    ``k`` rows are finite (:mod:`sbfunc.policies.base`). Stateless
    (:class:`~sbfunc.policies.EmptyState`); ``weights=None``; fixed shapes, no host reads.
    The last layer's bias is left out of the gradient, as in the official code.

    Args:
        keep: fraction kept, in (0, 1].

    Returns:
        A :class:`~sbfunc.policies.Policy` with ``needs = {"logits", "features", "targets"}``.

    Raises:
        TypeError: for ``keep`` not a number.
        ValueError: for ``keep`` outside (0, 1]; at ``select``, for missing signals or signals
            with another number of rows than the scores.

    Example:
        >>> from sbfunc.policies import divbs
        >>> from sbfunc.score import Signals
        >>> h = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
        >>> signals = Signals(torch.zeros(4, 2), h, torch.zeros(4, dtype=torch.int64))
        >>> policy = divbs(0.5)
        >>> sel, _ = policy.select(torch.ones(4), policy.init(), key=sbfunc.random.key(0),
        ...                        signals=signals)
        >>> len({int(i) // 2 for i in sel.indices})  # one row of each direction
        2

    References:
        Hong et al. 2024, "Diversified Batch Selection for Training Acceleration" (ICML);
        code: github.com/Feng-Hong/DivBS, ``methods/DivBS.py``.
    """
    keep = check_keep(keep)

    def rule(
        scores: torch.Tensor, state: EmptyState, a: SelectArgs
    ) -> tuple[Selection, EmptyState]:
        signals = a.signals
        assert signals is not None  # checked by make_policy (needs)
        return Selection(_divbs_select(scores, signals, keep, a.key)), state

    return make_policy(EmptyState, rule, needs=("logits", "features", "targets"))


def _divbs_select(
    scores: torch.Tensor, signals: Signals, keep: float, key: sbrandom.Key
) -> torch.Tensor:
    """The DivBS rows for finite scores; rows with non-finite scores zeroed and, should the
    greedy fill with any, swapped for unchosen finite rows at random."""
    logits, features, targets = signals.logits, signals.features, signals.targets
    assert logits is not None and features is not None and targets is not None
    n = scores.shape[0]
    ok = torch.isfinite(scores).to(logits.device)
    errors = last_layer_errors(logits, targets.to(logits.device))
    h = features.to(logits.device).reshape(n, -1)
    errors = torch.where(ok.unsqueeze(1), errors, 0.0)
    h = torch.where(ok.unsqueeze(1), h, 0.0)
    greedy_key, fill_key = sbrandom.split(key)
    k = kept_count(n, keep)
    picked = divbs_indices(gradient_gram(errors, h), k, key=greedy_key)
    # a zero row is chosen only once no row adds anything, at random among the rest: prefer
    # the finite ones (the picks first, then the others at random, then the non-finite rows)
    chosen = torch.zeros(n, dtype=torch.bool, device=ok.device).index_fill(0, picked, True)
    rank = ok.to(torch.float32) * 2.0 + chosen.to(torch.float32)
    tie_noise = sbrandom.bits(fill_key, (n,), device=ok.device)
    return top_k_indices(rank, k, tie_noise)
