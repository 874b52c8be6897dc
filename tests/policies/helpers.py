"""Shared test helpers: run a policy over many keys and check Monte-Carlo expectations."""

from __future__ import annotations

import math

import torch

from sbfunc import random as sbrandom
from sbfunc.policies import Policy
from sbfunc.select import Selection


def draws(policy: Policy, scores, state=None, *, n=2000, seed=0, **kwargs) -> list[Selection]:
    """``n`` selections from the same state with independent keys."""
    state = policy.init() if state is None else state
    keys = sbrandom.split(sbrandom.key(seed), n)
    return [policy.select(scores, state, key=k, **kwargs)[0] for k in keys]


def weighted_means(selections: list[Selection], losses: torch.Tensor) -> torch.Tensor:
    """The training step's estimator, mean over kept rows of ``w * L``, per selection."""
    out = []
    for sel in selections:
        kept = losses[sel.indices]
        w = torch.ones_like(kept) if sel.weights is None else sel.weights
        out.append((w * kept).mean())
    return torch.stack(out).double()


def assert_mean_close(samples: torch.Tensor, expected: float, sigmas: float = 5.0) -> None:
    """The sample mean lies within ``sigmas`` standard errors of ``expected``."""
    n = samples.shape[0]
    se = float(samples.std()) / math.sqrt(n) + 1e-6 * (1 + abs(expected))  # + float32 rounding
    mean = float(samples.mean())
    assert abs(mean - expected) <= sigmas * se, (mean, expected, se)


def kept_counts(selections: list[Selection]) -> torch.Tensor:
    return torch.tensor([s.indices.shape[0] for s in selections], dtype=torch.float64)
