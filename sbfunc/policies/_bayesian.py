"""Bayesian data selection (Deng, Cui & Zhu, NeurIPS 2023) as a
:class:`~sbfunc.policies.Policy`: top-k by a lower bound of the generalization loss reduction
under a last-layer Kronecker-factored Laplace posterior."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from sbfunc import random as sbrandom
from sbfunc._finite import finite_entries
from sbfunc.policies._base import Policy, SelectArgs, check_ids, make_policy
from sbfunc.policies._last_layer import last_layer_errors
from sbfunc.policies._tables import lookup_by_id, loss_table
from sbfunc.score import Signals
from sbfunc.select import Selection, check_keep, kept_count, top_k_indices
from sbfunc.validation import check_fraction, check_int, check_real, check_tensor

__all__ = ["BayesianState", "bayesian"]

VARIANCE_FLOOR = 1e-6
"""The least feature variance ``phi^T V^-1 phi`` (the official code's ``clamp(min=1e-6)``)."""


class BayesianState(NamedTuple):
    """The state of :func:`bayesian`: the Kronecker factors' moving averages and the reference
    table.

    Attributes:
        features: ``float32 Tensor[D, D]``, the EMA of ``H^T H / k`` over the kept rows' head
            inputs ``H`` (the official code's ``A``).
        classes: ``float32 Tensor[C, C]``, the EMA of ``E^T E / k`` over the kept rows'
            softmax errors ``E = softmax(z) - onehot(y)`` (the official code's ``G``).
        rows: ``int64`` 0-d, the rows the factors have seen (0: no posterior yet, the draws
            are the mean logits).
        reference_losses: ``Tensor[M]`` of a reference model's losses by sample id, or
            ``None``.

    Example:
        >>> from sbfunc.policies import bayesian
        >>> state = bayesian(0.5, num_features=3, num_classes=2).init()
        >>> state.features.shape, state.classes.shape, state.rows
        (torch.Size([3, 3]), torch.Size([2, 2]), tensor(0))

    References:
        Deng, Cui & Zhu 2023 (NeurIPS); github.com/Pengfight/Bayesian-Data-Selection,
        ``clip_prioritized_train_bayes_ema.py`` (``KFCALLAWrapper``).
    """

    features: torch.Tensor
    classes: torch.Tensor
    rows: torch.Tensor
    reference_losses: torch.Tensor | None = None


class _Config(NamedTuple):
    keep: float
    alpha: float
    draws: int
    decay: float
    prior_precision: float
    num_effective_data: float


def bayesian(
    keep: float,
    *,
    num_features: int,
    num_classes: int,
    reference_losses: torch.Tensor | None = None,
    alpha: float = 0.2,
    draws: int = 256,
    decay: float = 0.99,
    prior_precision: float = 10.0,
    num_effective_data: float = 200.0,
    **removed: Any,
) -> Policy:
    """Bayesian data selection: the ``k = max(1, floor(keep*N))`` rows of highest
    ``alpha * E_q[log p(y|f)] + (1 - alpha) * log p_ref(y|x) - log E_q[p(y|f)]``.

    ``q`` is a last-layer Laplace posterior with Kronecker factors (no bias, as the official
    code): the logits of row ``i`` are ``f = z_i + s_i * eps @ L_U^-T`` with ``z_i`` the mean
    logits, ``s_i^2 = max(phi_i^T V^-1 phi_i, 1e-6)`` (``phi_i`` the head's input),
    ``V = sqrt(n) A + sqrt(lambda) I``, ``U = sqrt(n) G + sqrt(lambda) I = L_U L_U^T``
    (``n = num_effective_data``, ``lambda = prior_precision``) and ``eps`` standard normal:
    ``draws`` of them, ``sbfunc.random.normal(split(key)[0], (draws, C))``, shared by every row
    (common random numbers: each row's estimate has the law of its own ``draws`` independent
    draws, and rows are compared on the same draws). Ties are broken at random by
    ``split(key)[1]``. ``A`` and ``G`` (:class:`BayesianState`) are moving
    averages (``decay``) of the kept rows' ``phi phi^T`` and ``e e^T``, ``e = softmax(z) -
    onehot(y)``, updated after each selection (the first update copies); before any update
    every draw is ``z`` and the score is ``(1 - alpha) * (loss - reference loss)``, RHO-LOSS.

    ``reference_losses[id]`` is ``-log p_ref(y|x)``, the loss of sample ``id`` under a
    reference model (RHO-LOSS's irreducible loss; the paper's zero-shot CLIP): the one sign
    convention of every sbfunc policy that takes a reference, so the table of
    :func:`~sbfunc.policies.rho_loss` serves as it is. It is a per-id table in the state as
    ``rho_loss`` keeps it (ids required, in ``[0, len(reference_losses))``, checked as there);
    a table of log-likelihoods (no positive entry) is refused. With ``reference_losses=None``
    the term is dropped, which selects the same rows as a uniform reference (a constant
    ``log C``).

    Needs the signals ``logits``, ``features`` and ``targets`` (class indices); the scores are
    read only for their finiteness (the loss is the cross-entropy of the logits): a row with a
    non-finite score, logits or features ranks last and is never recorded in the factors.
    ``weights=None``; fixed shapes, no host reads.

    **Cost.** Per step, a ``D x D`` Cholesky factorisation and a triangular solve of the ``N``
    rows' features (``O(D^3 + N D^2)``, whatever ``draws`` is), ``draws * C`` normal draws and
    ``N * draws * C`` drawn logits to reduce. ``draws`` is the lever on the last part: on the
    1-D CNN of ``benchmarks/eager_selection.py`` (``D = 640``, ``N = 256``, ``C = 10``) an eager
    step costs about 1.6-1.8x a uniform SB step at the default 256 draws, 1.5-1.7x at 16 and
    2.4x at 1024, the factorisation being half of the selection's time. Since sbfunc 1.1 the
    rows share the draws (1.0 drew ``(N, draws, C)`` normals: 11-22x a uniform SB step
    eagerly); the same key gives the same numbers eagerly and compiled on every device, and
    they are ``jax.random.normal(k, (draws, C))``'s.

    Deviations from the official code: the factors are updated from the scoring forward's
    signals of the kept rows (the code uses the training forward of the kept rows, the same
    parameters in train mode); the rows share their draws (the code draws ``(N, draws, C)``);
    no Cholesky jitter retries (the prior keeps both factors positive definite); ``log E_q p``
    by ``logsumexp``.

    Args:
        keep: fraction kept, in (0, 1] (the code's ``select_rate``, 0.1).
        num_features: ``D``, the width of the head's input.
        num_classes: ``C``, the number of logits.
        reference_losses: ``Tensor[M]`` floating, the reference's loss (``-log p_ref``, >= 0)
            by sample id (one entry per dataset index), or ``None``.
        alpha: the weight of the model's own term, in [0, 1] (code: 0.5 by default, 0.2 for
            CIFAR-10 and 0.3 for CIFAR-100 in its README).
        draws: Monte-Carlo draws of the logits, shared by the rows (code: 256 per row); the
            cost of the predictive part grows with it (see Cost).
        decay: the factors' EMA momentum, in [0, 1) (code: 0.99).
        prior_precision: ``lambda > 0`` (code: 1 by default, 10 in its README).
        num_effective_data: ``n > 0`` (code: 10000 by default, 200 for CIFAR-10 and 1000 for
            CIFAR-100 in its README).

    Returns:
        A :class:`~sbfunc.policies.Policy` with ``needs = {"logits", "features", "targets"}``
        and :class:`BayesianState`.

    Raises:
        TypeError: for an argument of the wrong type.
        ValueError: for an argument out of range (an empty ``reference_losses``, or one that
            holds log-likelihoods); at ``select``, for missing signals, signals of another width
            than ``num_features`` / ``num_classes``, missing ``ids`` with a reference, or (CPU
            ids, eager code) an id outside ``[0, len(reference_losses))``.

    Example:
        >>> from sbfunc.policies import bayesian
        >>> from sbfunc.score import Signals
        >>> policy = bayesian(0.5, num_features=2, num_classes=2, draws=8)
        >>> logits = torch.tensor([[4.0, 0.0], [0.0, 4.0], [0.0, 0.0], [1.0, 0.0]])
        >>> signals = Signals(logits, torch.ones(4, 2), torch.tensor([0, 0, 0, 0]))
        >>> sel, state = policy.select(torch.ones(4), policy.init(), key=sbfunc.random.key(0),
        ...                            signals=signals)
        >>> sel.indices, state.rows  # the highest losses first, without a reference
        (tensor([1, 2]), tensor(2))

    References:
        Deng, Cui & Zhu 2023, "Towards Accelerated Model Training via Bayesian Data Selection"
        (NeurIPS); github.com/Pengfight/Bayesian-Data-Selection,
        ``clip_prioritized_train_bayes_ema.py`` (lines 195-199: the score; 337-349: the
        posterior draws; 354-373: the factor updates; 68-79: the defaults).
    """
    _refuse_removed(removed)
    cfg = _Config(
        check_keep(keep),
        check_fraction(alpha, "alpha", fix="alpha weighs the model's term against the reference"),
        check_int(draws, "draws", low=1, fix="e.g. draws=256"),
        check_fraction(decay, "decay", open_high=True, fix="decay is an EMA momentum, e.g. 0.99"),
        check_real(prior_precision, "prior_precision", low=0.0, open_low=True),
        check_real(num_effective_data, "num_effective_data", low=0.0, open_low=True),
    )
    dims = (
        check_int(num_features, "num_features", low=1),
        check_int(num_classes, "num_classes", low=1),
    )
    table = None
    if reference_losses is not None:
        table = loss_table(
            reference_losses, "reference_losses", "index it by sample id: Tensor[M] of losses"
        )

    def init() -> BayesianState:
        d, c = dims
        zeros = torch.zeros((), dtype=torch.int64)
        return BayesianState(torch.zeros(d, d), torch.zeros(c, c), zeros, table)

    def rule(
        scores: torch.Tensor, state: BayesianState, a: SelectArgs
    ) -> tuple[Selection, BayesianState]:
        signals = _checked(a.signals, dims)
        reference_ll = None
        if state.reference_losses is not None:
            ids = check_ids(a.ids, scores.shape[0], "bayesian")
            lookup = lookup_by_id(state.reference_losses, ids, "reference_losses", "bayesian")
            reference_ll = -lookup
        noise_key, tie_key = sbrandom.split(a.key)
        objective = _objective(scores, signals, state, reference_ll, noise_key, cfg)
        tie_noise = sbrandom.bits(tie_key, (scores.shape[0],), device=scores.device)
        kept = top_k_indices(objective, kept_count(scores.shape[0], cfg.keep), tie_noise)
        return Selection(kept), _update(state, signals, kept, torch.isfinite(objective), cfg)

    return make_policy(init, rule, needs=("logits", "features", "targets"))


def _refuse_removed(removed: dict[str, Any]) -> None:
    """Refuse 1.0's ``reference=`` (log-likelihoods, the other sign) by name."""
    if "reference" in removed:
        raise TypeError(
            "bayesian(reference=...) took log-likelihoods; since sbfunc 1.1 the reference is "
            "reference_losses=, the reference model's losses (-log p >= 0, the sign of "
            "rho_loss's irreducible, so one table serves both): pass reference_losses=-reference"
        )
    if removed:
        raise TypeError(f"bayesian() got unexpected keyword arguments {sorted(removed)}")


def _checked(signals: Signals | None, dims: tuple[int, int]) -> Signals:
    """The logits ``[N, C]``, the features flattened to ``[N, D]`` on the logits' device."""
    assert signals is not None and signals.logits is not None  # checked by make_policy (needs)
    assert signals.features is not None and signals.targets is not None
    logits = check_tensor(signals.logits, "signals.logits", dim=2, floating=True)
    features = signals.features.reshape(logits.shape[0], -1).to(logits.device)
    check_tensor(features, "signals.features", floating=True)
    got = (features.shape[1], logits.shape[1])
    if got != dims:
        raise ValueError(
            f"bayesian was built for num_features={dims[0]}, num_classes={dims[1]}; the signals "
            f"have {got[0]} features and {got[1]} logits per row"
        )
    return Signals(logits, features, signals.targets.to(logits.device))


def _cholesky(factor: torch.Tensor, cfg: _Config, dtype: torch.dtype) -> torch.Tensor:
    """The lower Cholesky factor of ``sqrt(n) * factor + sqrt(lambda) * I`` (no host check)."""
    precision = factor.to(dtype) * math.sqrt(cfg.num_effective_data)
    precision.diagonal().add_(math.sqrt(cfg.prior_precision))
    return torch.linalg.cholesky_ex(precision).L


def _stds(h: torch.Tensor, state: BayesianState, cfg: _Config, dtype: torch.dtype) -> torch.Tensor:
    """``Tensor[N]``: ``sqrt(max(phi_i^T V^-1 phi_i, 1e-6))``, 0 before any factor update (the
    draws are then the mean logits). With ``V = L L^T``, ``phi^T V^-1 phi`` is the squared norm
    of row ``i`` of ``H L^-T``: one triangular solve from the right, with no transposed copy."""
    lower = _cholesky(state.features, cfg, dtype)
    z = torch.linalg.solve_triangular(lower.T, h.to(dtype), upper=True, left=False)
    std = torch.linalg.vector_norm(z, dim=1).clamp_min(math.sqrt(VARIANCE_FLOOR))
    return torch.where(state.rows > 0, std, 0.0)


def _class_noise(
    state: BayesianState, key: sbrandom.Key, cfg: _Config, dtype: torch.dtype, classes: int
) -> torch.Tensor:
    """``Tensor[C, draws]``: ``(eps @ L_U^-T)^T = L_U^-1 eps^T`` for ``eps = normal(key,
    (draws, C))``, the draws every row shares (common random numbers), class-major."""
    lower = _cholesky(state.classes, cfg, dtype)
    eps = sbrandom.normal(key, (cfg.draws, classes), dtype=dtype, device=lower.device)
    return torch.linalg.solve_triangular(lower, eps.T, upper=False).contiguous()


def _objective(
    scores: torch.Tensor,
    signals: Signals,
    state: BayesianState,
    reference_ll: torch.Tensor | None,
    key: sbrandom.Key,
    cfg: _Config,
) -> torch.Tensor:
    """The selection objective per row, NaN where the score, logits or features are not
    finite. The drawn logits ``f = z_i + s_i e_j`` are laid out class-major, ``[C, N,
    draws]``, so the log-sum-exp over the classes reduces over the outer dimension (contiguous
    rows of draws) and ``f`` is made in one fused multiply-add."""
    logits, h, y = signals.logits, signals.features, signals.targets
    assert logits is not None and h is not None and y is not None
    dtype = torch.promote_types(logits.dtype, torch.float32)
    n, c = logits.shape
    z = logits.to(dtype)
    std = _stds(h, state, cfg, dtype)
    e = _class_noise(state, key, cfg, dtype, c)  # [C, S]
    f = torch.addcmul(z.T.contiguous().unsqueeze(2), std.reshape(1, n, 1), e.unsqueeze(1))
    target = torch.addcmul(z.gather(1, y.reshape(n, 1)), std.reshape(n, 1), e[y])
    ll = target.sub_(_logsumexp_(f, 0))  # log p(y|f) per draw, [N, S]
    mean_ll = ll.mean(1)
    objective = cfg.alpha * mean_ll - (_logsumexp_(ll, 1) - math.log(cfg.draws))
    if reference_ll is not None:
        objective = objective + (1.0 - cfg.alpha) * reference_ll.to(objective)
    ok = _finite_rows(scores.to(logits.device), signals)
    return torch.where(ok, objective, torch.nan)


def _logsumexp_(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``log(sum(exp(x), dim))``, overwriting ``x``: shifted by the maximum, as
    ``torch.logsumexp`` (whose guard for an infinite maximum is left out: a row with one is
    not finite and ranks last anyway)."""
    top = x.amax(dim, keepdim=True)
    return x.sub_(top).exp_().sum(dim).log_().add_(top.squeeze(dim))


def _finite_rows(scores: torch.Tensor, signals: Signals) -> torch.Tensor:
    assert signals.logits is not None and signals.features is not None
    rows = finite_entries(signals.logits).all(1) & finite_entries(signals.features).all(1)
    return finite_entries(scores) & rows


def _update(
    state: BayesianState,
    signals: Signals,
    kept: torch.Tensor,
    finite: torch.Tensor,
    cfg: _Config,
) -> BayesianState:
    """The factors after the kept rows with a finite objective: ``A <- decay * A + (1 -
    decay) * H^T H / k`` (a copy on the first update; no change when no row counts)."""
    assert signals.logits is not None and signals.features is not None
    assert signals.targets is not None
    ok = finite.index_select(0, kept).unsqueeze(1)  # the kept rows that count (k static)
    h = torch.where(ok, signals.features.index_select(0, kept), 0.0).to(state.features)
    logits, targets = signals.logits.index_select(0, kept), signals.targets.index_select(0, kept)
    e = torch.where(ok, last_layer_errors(logits, targets), 0.0).to(state.classes)
    count = ok.sum()
    first = torch.where(state.rows == 0, 1.0, 1.0 - cfg.decay)
    w = torch.where(count > 0, first, 0.0).to(state.features.dtype)
    scale = (w / count.clamp_min(1)).sqrt()  # the rows scaled by sqrt(w / k): one addmm each
    features = torch.addmm(state.features * (1.0 - w), h.T * scale, h * scale)
    classes = torch.addmm(state.classes * (1.0 - w), e.T * scale, e * scale)
    return BayesianState(features, classes, state.rows + count, state.reference_losses)
