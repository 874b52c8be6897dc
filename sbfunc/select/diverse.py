"""Diversified batch selection (DivBS): keep the rows whose last-layer gradients together best
cover the batch's summed gradient, as a pure function of fixed shapes.

The feature of row ``i`` is the last linear layer's per-sample gradient of the cross-entropy,
``g_i = (softmax(z_i) - onehot(y_i)) outer h_i`` (``h_i`` the penultimate activation), whose
inner products factor, ``<g_i, g_j> = <p_i - e_i, p_j - e_j> * <h_i, h_j>``: the Gram matrix
(:func:`gradient_gram`) costs ``N * N * (C + d)`` instead of materialising ``N`` vectors of
``C * d``. :func:`divbs_indices` then runs the greedy selection on the Gram matrix alone.

References:
    Hong et al. 2024, "Diversified Batch Selection for Training Acceleration" (ICML);
    code: github.com/Feng-Hong/DivBS, ``methods/DivBS.py`` (``greedy_selection``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from sbfunc import random as sbrandom
from sbfunc.random.keys import Key, check_key
from sbfunc.validation import check_int, check_tensor

__all__ = ["divbs_indices", "gradient_gram", "last_layer_errors"]


def _at_least_float32(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def last_layer_errors(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The cross-entropy's gradient with respect to the logits, ``softmax(z) - onehot(y)``, per
    row (the sum-reduced loss's; a mean only rescales every row alike).

    Args:
        logits: ``Tensor[N, C]`` floating.
        targets: ``int64 Tensor[N]`` of class indices in ``[0, C)`` (not checked on the host:
            an index out of range gives the row no one-hot term).

    Returns:
        ``Tensor[N, C]`` in the logits' dtype promoted to at least float32.

    Example:
        >>> from sbfunc.select.diverse import last_layer_errors
        >>> last_layer_errors(torch.zeros(2, 2), torch.tensor([0, 1]))
        tensor([[-0.5000,  0.5000],
                [ 0.5000, -0.5000]])
    """
    check_tensor(logits, "logits", dim=2, floating=True)
    check_tensor(targets, "targets", dim=1, size=logits.shape[0], floating=False)
    probs = torch.softmax(logits.to(_at_least_float32(logits.dtype)), dim=1)
    classes = torch.arange(logits.shape[1], device=logits.device)
    return probs - (targets.unsqueeze(1) == classes).to(probs.dtype)


def gradient_gram(errors: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """The Gram matrix of the last-layer gradient embeddings ``g_i = errors_i outer
    features_i``: ``(E E^T) * (H H^T)``, without materialising any ``g_i``.

    For a last layer with a bias, append a column of ones to ``features`` (the bias's gradient
    is ``errors_i`` itself).

    Args:
        errors: ``Tensor[N, C]`` floating, e.g. :func:`last_layer_errors`.
        features: ``Tensor[N, d]`` floating, the penultimate activations.

    Returns:
        ``Tensor[N, N]``, symmetric positive semi-definite, in the promoted dtype of the two
        (at least float32).

    Example:
        >>> from sbfunc.select.diverse import gradient_gram
        >>> gradient_gram(torch.tensor([[1.0, -1.0], [0.5, 0.0]]), torch.eye(2))
        tensor([[2.0000, 0.0000],
                [0.0000, 0.2500]])
    """
    check_tensor(errors, "errors", dim=2, floating=True)
    check_tensor(features, "features", dim=2, size=errors.shape[0], floating=True)
    dtype = _at_least_float32(torch.promote_types(errors.dtype, features.dtype))
    e, h = errors.to(dtype), features.to(dtype)
    return (e @ e.T) * (h @ h.T)


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
    g = gram.to(_at_least_float32(gram.dtype))
    bad = ~torch.isfinite(g.diagonal())
    return torch.where(bad.unsqueeze(0) | bad.unsqueeze(1) | ~torch.isfinite(g), 0.0, g)


class _Consts(NamedTuple):
    """What every step reads: the Gram matrix, the tie order (higher first), the relative
    tolerance, the squared residual norm below which the sum counts as covered, and each
    row's squared norm below which its new part counts as nothing."""

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
    covered = rtol * g.sum() + eps * n * diag.sum()  # g.sum(): the summed row's norm squared
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
    Once ``r`` is covered (to a relative ``sqrt(eps)``: the sum lies in the kept rows' span),
    the rows that still add a new direction come first, then the rest (duplicates, zero
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
        >>> from sbfunc.select.diverse import divbs_indices, gradient_gram
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
