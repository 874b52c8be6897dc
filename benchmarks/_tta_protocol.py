"""The two protocols of the time-to-accuracy study and of the selection field (issue 37).

``equal-candidates`` (the committed studies): every method loads the same batches of ``B``
rows; a selecting method backpropagates ``keep`` of them, so its backward runs on a smaller
batch. ``equal-backprop`` (the papers' protocol: Jiang et al. 2019 fill full batches,
airbench backpropagates 512 of 1024 candidates): plain trains on batches of ``B``, a selecting
method loads :func:`sbfunc.selective_backprop.candidate_batch_size` ``(B, keep)`` candidate
rows a step and backpropagates about ``B``. Both give every method the same number of epochs
over the training set; under ``equal-backprop`` a selecting method takes about ``keep`` times
plain's steps, and each run's cosine schedule decays to zero at its own step count."""

from __future__ import annotations

from dataclasses import replace
from typing import TypeVar

from _tta_methods import INFOBATCH_LEARNED, Sizes

from sbfunc.selective_backprop import candidate_batch_size

EQUAL_CANDIDATES, EQUAL_BACKPROP = "equal-candidates", "equal-backprop"
PROTOCOLS = (EQUAL_CANDIDATES, EQUAL_BACKPROP)
# the share of a loaded batch the methods whose kept count is not the study's keep
# backpropagate: jiang_cdf and stale_sb at beta=1 keep 1 / (1 + beta); infobatch (r=0.5)
# keeps 1 - r * f, f the share of rows below the mean recorded loss (INFOBATCH_LEARNED)
OWN_KEEP = {"plain": 1.0, "jiang_var": 0.5, "stale_sb": 0.5, "loshchilov_k0.3": 0.3,
            "infobatch": 1.0 - 0.5 * INFOBATCH_LEARNED}  # fmt: skip
NOTES = {
    EQUAL_CANDIDATES: (
        "Protocol `equal-candidates`: every method loads the same batches of `batch` rows (the "
        "same loader batches, in the same order per seed) for the same number of epochs; a "
        "selecting method backpropagates its kept share of each, on a smaller batch than "
        "plain's."
    ),
    EQUAL_BACKPROP: (
        "Protocol `equal-backprop` (the papers': Jiang et al. 2019 fill full batches, airbench "
        "backpropagates 512 of 1024 candidates): plain trains on batches of `batch` rows; a "
        "selecting method loads `candidate_batch_size(batch, keep)` candidate rows a step "
        "(`sbfunc.selective_backprop`; `keep` its kept share, the budget in the field; the "
        "loader batch per method is listed below) and backpropagates about `batch` of them. "
        "The budget is the same number of epochs over the training set for every method (each "
        "epoch drops the last, incomplete loader batch), so a selecting method takes about "
        "`keep` times plain's steps; every run's cosine learning rate decays to zero at its "
        "own step count. Each seed's loader order is the same permutation, cut into larger "
        "batches."
    ),
}


C = TypeVar("C", bound=Sizes)


def expected_keep(method: str, keep: float) -> float:
    """The share of a loaded batch ``method`` backpropagates, on average, at the study's kept
    fraction ``keep`` (``OWN_KEEP`` for the methods with a kept share of their own)."""
    return OWN_KEEP.get(method, keep)


def method_config(cfg: C, method: str, protocol: str, keep: float | None = None) -> C:
    """``cfg`` with ``method``'s loader batch under ``protocol`` (``keep``, default
    ``cfg.keep``, is the method's kept fraction): ``cfg.batch`` under ``equal-candidates`` and
    for plain, ``candidate_batch_size(cfg.batch, keep)`` for a selecting method under
    ``equal-backprop``.

    Raises:
        ValueError: for an unknown protocol, or a loader batch larger than the training set.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
    if protocol == EQUAL_CANDIDATES:
        return cfg
    share = expected_keep(method, cfg.keep if keep is None else keep)
    batch = candidate_batch_size(cfg.batch, share)
    if batch > cfg.train:
        raise ValueError(
            f"{method}'s candidate batch of {batch} rows (batch {cfg.batch} / keep {share:g}) "
            f"exceeds the {cfg.train} training rows: lower the batch or raise the rows"
        )
    return replace(cfg, batch=batch)  # type: ignore[type-var]


def output_stem(base: str, protocol: str) -> str:
    """The output files' stem: ``base`` under ``equal-candidates`` (the committed results),
    ``base_equal_backprop`` under ``equal-backprop``."""
    return base if protocol == EQUAL_CANDIDATES else f"{base}_{protocol.replace('-', '_')}"
