"""Shared helpers for the sbfunc.random tests."""

import contextlib
import math

import pytest
import torch
from hypothesis import settings

from sbfunc.random import _host
from sbfunc.random import _keys as keys

SETTINGS = settings(max_examples=40, derandomize=True, database=None, deadline=None)


@contextlib.contextmanager
def tensor_path():
    """Force key derivation onto the tensor path (what torch.compile and torch.func see)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_host, "host_readable", lambda t: False)
        mp.setattr(keys, "host_readable", lambda t: False)
        yield


def ks_statistic(samples: torch.Tensor, cdf) -> float:
    """Kolmogorov-Smirnov distance between the empirical CDF of ``samples`` and ``cdf``."""
    x, _ = torch.sort(samples.double().flatten())
    n = x.numel()
    f = cdf(x)
    above = torch.arange(1, n + 1, dtype=torch.float64) / n - f
    below = f - torch.arange(n, dtype=torch.float64) / n
    return max(above.max().item(), below.max().item())


def ks_bound(n: int) -> float:
    """The KS distance exceeded with probability ~1e-6 under the null (Dvoretzky et al.)."""
    return math.sqrt(math.log(2 / 1e-6) / (2 * n))
