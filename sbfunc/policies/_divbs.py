"""Diversified batch selection (DivBS) as a :class:`~sbfunc.policies.Policy`: keep the rows
whose last-layer gradients together best cover the batch's summed gradient
and the greedy selection on their Gram matrix (:func:`divbs_indices`).

References:
    Hong et al. 2024, "Diversified Batch Selection for Training Acceleration" (ICML);
    code: github.com/Feng-Hong/DivBS, ``methods/DivBS.py`` (``greedy_selection``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from sbfunc import random as sbrandom
from sbfunc.policies._base import Policy, SelectArgs, make_policy
from sbfunc.policies._last_layer import at_least_float32, gradient_gram, last_layer_errors
from sbfunc.random import Key, check_key
from sbfunc.score import Signals
from sbfunc.select import Selection, check_keep, kept_count, top_k_indices
from sbfunc.types import EmptyState
from sbfunc.validation import check_int, check_tensor

__all__ = ["divbs", "divbs_indices"]


def divbs(keep: float) -> Policy:
    """DivBS: the ``k = max(1, floor(keep*N))`` rows chosen greedily by orthogonalised
    representativeness of their last-layer gradients (:func:`~sbfunc.policies.divbs_indices` on
    :func:`~sbfunc.policies.gradient_gram` of :func:`~sbfunc.policies.last_layer_errors` and the
    head's input features).

    Needs the signals ``logits``, ``features`` and ``targets`` (``Policy.needs``; Selective
    Backprop's scoring forward provides them) and reads the scores only for their finiteness:
    a row with a non-finite score counts as a zero gradient and is kept only when fewer than
    ``k`` rows are finite (:mod:`sbfunc.policies`). Stateless
    (:class:`~sbfunc.types.EmptyState`); ``weights=None``; fixed shapes, no host reads.
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


class _Greedy(NamedTuple):
    """The greedy state, a pivoted partial Cholesky factorisation of the Gram matrix.

    ``proj[t, i] = <q_t, g_i>`` for the orthonormal vectors ``q_t`` of the kept rows (a zero
    row: not chosen yet, or a kept row that added no direction); ``align[i] = <g_i, r>`` with
    ``r`` the part of the summed gradient outside their span; ``fresh[i]``: the squared norm of
    ``g_i``'s part outside it; ``left``: the rows not yet kept."""

    proj: torch.Tensor
    align: torch.Tensor
    fresh: torch.Tensor
    left: torch.Tensor


def _check_gram(gram: torch.Tensor) -> torch.Tensor:
    check_tensor(gram, "gram", dim=2, floating=True)
    if gram.shape[0] != gram.shape[1]:
        shape = tuple(gram.shape)
        raise ValueError(f"gram must be a square N x N matrix, got a tensor of shape {shape}")
    return gram


def _finite_gram(gram: torch.Tensor) -> torch.Tensor:
    """``gram`` in at least float32, with the row and column of every non-finite diagonal
    entry (and any other non-finite entry) zeroed: a row that cannot be scored counts as a
    zero feature, kept only to fill ``k``."""
    g = gram.to(at_least_float32(gram.dtype))
    bad = ~torch.isfinite(g.diagonal())
    return torch.where(bad.unsqueeze(0) | bad.unsqueeze(1) | ~torch.isfinite(g), 0.0, g)


_ROUNDING = 128
"""The residual counts as zero below ``_ROUNDING * eps * (||sum_i g_i||^2 + trace)``, the
rounding level of the computed ``||r||^2``: on float32 problems whose exact residual is zero
it stays under about ``70 eps`` times that scale (random rank-deficient Gram matrices, rows'
norms spread over decades), while ``sqrt(eps)`` (2896 eps in float32) hid residuals the
greedy still resolves."""


class _Consts(NamedTuple):
    """What every step reads: the Gram matrix, the tie order (higher first), the relative
    tolerance of near-ties, the squared residual norm below which the sum counts as covered
    (rounding level), and each row's squared norm below which its new part counts as
    nothing."""

    gram: torch.Tensor
    prio: torch.Tensor
    rtol: float
    covered: torch.Tensor
    nothing: torch.Tensor


def _consts(g: torch.Tensor, key: Key | None) -> _Consts:
    n, eps = g.shape[0], torch.finfo(g.dtype).eps
    rtol, diag = eps**0.5, g.diagonal()
    if key is None:
        prio = -torch.arange(n, device=g.device, dtype=torch.float32)
    else:
        prio = sbrandom.uniform(key, (n,), device=g.device)
    # g.sum(): the summed row's norm squared; below this the residual is rounding only
    covered = _ROUNDING * eps * (g.sum() + diag.sum())
    return _Consts(g, prio, rtol, covered, rtol * diag + eps * diag.amax())


def _choose(s: _Greedy, c: _Consts) -> torch.Tensor:
    """The next row (a 0-d index): the best aligned with the residual (near-ties within
    ``rtol``); once the residual is covered, a random row that adds a new direction; once none
    does, a random row. Kept rows are masked out with ``-inf``."""
    score = torch.where(s.left, s.align.abs(), -torch.inf)
    uncovered = s.align.sum() > c.covered  # sum_i <g_i, r> = ||r||^2
    aligned = s.left & (score >= score.amax() * (1.0 - c.rtol)) & uncovered
    adds = s.left & (s.fresh > c.nothing)
    pool = torch.where(aligned.any(), aligned, torch.where(adds.any(), adds, s.left))
    return torch.where(pool, c.prio, -torch.inf).argmax()


def _add(s: _Greedy, c: _Consts, j: torch.Tensor, t: int) -> _Greedy:
    """``s`` with row ``j`` kept as step ``t``: one step of pivoted Cholesky. ``g_j``'s part
    outside the span, ``u = g_j - sum_s <q_s, g_j> q_s``, has ``<u, g_i> = G[j, i] -
    sum_s proj[s, j] proj[s, i]`` and ``||u||^2 = fresh[j]``; ``q_t = u / ||u||``, and the
    residual loses its component ``<q_t, r> = <q_t, sum_i g_i> = sum_i <q_t, g_i>``."""
    j1 = j.reshape(1)
    row = c.gram.index_select(0, j1).reshape(-1) - s.proj.index_select(1, j1).reshape(-1) @ s.proj
    norm2 = s.fresh.index_select(0, j1).reshape(())
    adds = norm2 > c.nothing.index_select(0, j1).reshape(())
    scale = torch.where(adds, norm2.clamp_min(torch.finfo(row.dtype).tiny).rsqrt(), 0.0)
    q_g = row * scale  # <q_t, g_i>
    steps = torch.arange(s.proj.shape[0], device=row.device)
    proj = torch.where((steps == t).unsqueeze(1), q_g.unsqueeze(0), s.proj)
    rows = torch.arange(row.shape[0], device=row.device)
    align = s.align - q_g.sum() * q_g
    return _Greedy(proj, align, (s.fresh - q_g**2).clamp_min(0.0), s.left & (rows != j))


def divbs_indices(gram: torch.Tensor, k: int, *, key: Key | None = None) -> torch.Tensor:
    """Keep ``k`` rows by DivBS's greedy orthogonalised representativeness, on the Gram
    matrix of the rows' features alone (:func:`gradient_gram`).

    Start from the residual ``r = sum_i g_i``; ``k`` times, keep the row of largest
    ``|<g_i, r>|``, Gram-Schmidt it against the kept rows into ``q`` and set
    ``r <- r - <q, r> q``. Only inner products are kept, as a pivoted partial Cholesky
    factorisation of ``gram`` (each ``<q_t, g_i>``): ``O(k^2 N)`` work, fixed shapes, no host
    reads (a Python loop of ``k`` steps of a few vector operations). Rows scoring within a
    relative ``sqrt(eps)`` of the best tie.
    Once ``r`` is covered (``||r||^2`` at rounding level, ``128 eps`` times
    ``||sum_i g_i||^2 + trace``: the sum lies in the kept rows' span, in float32 as in
    float64), the rows that still add a new direction come first, then the rest (duplicates, zero
    features), each time in the key's random order (``key=None``: lowest index first). Rows
    with a non-finite Gram entry count as zero features.

    Unlike the official code, which draws each row with probability proportional to
    ``|<g_i, r>|`` and pads with uniformly random rows once ``r`` is zero, this takes the
    argmax as the paper's greedy algorithm does, and always returns exactly ``k`` rows.

    Args:
        gram: ``Tensor[N, N]`` floating, symmetric positive semi-definite (computed in at
            least float32).
        k: how many rows to keep, an int in ``[1, N]``.
        key: a key for the tie order, or ``None`` (lowest index first).

    Returns:
        ``int64 Tensor[k]`` of distinct row indices, ascending, on ``gram``'s device.

    Raises:
        TypeError: ``gram`` not a floating tensor, ``k`` not an int, ``key`` not a key.
        ValueError: ``gram`` not square 2-D, ``k`` outside ``[1, N]``.

    Example:
        >>> from sbfunc.policies import divbs_indices, gradient_gram
        >>> h = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 0.5]])
        >>> divbs_indices(gradient_gram(torch.ones(4, 1), h), 2)  # one row of each direction
        tensor([0, 2])

    References:
        Hong et al. 2024, "Diversified Batch Selection for Training Acceleration" (ICML),
        the greedy algorithm and its ``1 - 1/e`` guarantee; github.com/Feng-Hong/DivBS,
        ``methods/DivBS.py`` (``greedy_selection``).
    """
    _check_gram(gram)
    n = gram.shape[0]
    check_int(k, "k", low=1, high=n, fix=f"gram has N={n} rows")
    if key is not None:
        check_key(key, "key")
    c = _consts(_finite_gram(gram), key)
    g = c.gram
    s = _Greedy(g.new_zeros(k, n), g.sum(1), g.diagonal().clone(), g.new_ones(n) > 0)
    picks = []
    for t in range(k):
        j = _choose(s, c)
        s = _add(s, c, j, t)
        picks.append(j)
    return torch.sort(torch.stack(picks)).values
