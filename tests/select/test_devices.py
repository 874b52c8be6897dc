"""Every function of :mod:`sbfunc.select` (and the samplers the policies share) on the
``meta`` device (tensors without data: a host read or a device mix raises there), for every
score dtype: none reads the device. ``kept_count`` is host arithmetic on a shape."""

from __future__ import annotations

import pytest
import torch

from sbfunc import policies, select
from sbfunc import random as sbrandom
from tests.meta import META, empty

N, K = 10, 4
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64]
NOISE = {  # how ties are broken: a key, given noise, or by position
    "key": lambda: {"key": sbrandom.key(0).to(META)},
    "tie_noise": lambda: {"tie_noise": empty(N, dtype=torch.int64)},
    "position": lambda: {},
}


def _run_all(scores: torch.Tensor, noise: dict) -> dict[str, torch.Tensor]:
    """Every tensor function of the package on ``scores``."""
    log_w = policies.rank_power_log_weights(select.ranks(scores, **noise), 0.5)
    gumbel = sbrandom.gumbel(sbrandom.key(1).to(META), (N,))
    tie = noise.get("tie_noise")
    lowest, _ = select.finite_split(scores)
    return {
        "ranks": select.ranks(scores, **noise),
        "ascending_order": select.ascending_order(scores, tie),
        "ascending_lowest": select.ascending_lowest(lowest, tie),
        "finite_split": lowest,
        "nonfinite_lowest": select.nonfinite_lowest(scores),
        "rank_power_log_weights": log_w,
        "gumbel_top_k": select.gumbel_top_k(log_w, K, gumbel),
        "perturbed": select.perturbed(log_w, gumbel),
        "sorted_unique": select.sorted_unique(empty(K, dtype=torch.int64), N),
        "top_k_indices": select.top_k_indices(scores, K, tie),
        "random_indices": select.random_indices(scores, K, empty(N)),
        "rank_power_indices": policies.rank_power_indices(
            scores, 0.5, empty(N, dtype=torch.int64), empty(N)
        ),
    }


def test_every_public_name_is_covered():
    host = {"kept_count", "Selection"}  # Python ints from a shape; a NamedTuple of tensors
    host |= {"check_keep"}  # a host check of a Python number
    host |= {"distinct_order"}  # an eager CPU shortcut: None on a device, nothing read
    assert set(select.__all__) - host <= _run_all(empty(N), {}).keys()
    assert select.distinct_order(empty(N)) is None
    assert select.kept_count(N, 0.5) == 5


@pytest.mark.parametrize("noise", sorted(NOISE))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_selection_function_stays_on_the_device(dtype, noise):
    out = _run_all(empty(N, dtype=dtype), NOISE[noise]())
    for name, t in out.items():
        assert t.device == META, name
    assert out["ranks"].shape == (N,) and out["gumbel_top_k"].shape == (K,)
    assert out["rank_power_indices"].shape == (select.kept_count(N, 0.5),)
