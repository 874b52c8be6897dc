"""Select: pure functions from per-sample scores to kept indices, with explicit randomness."""

from sbfunc.select.base import (
    Selection,
    ascending_order,
    check_keep,
    kept_count,
    nan_as_inf,
    ranks,
)
from sbfunc.select.samplers import (
    gumbel_top_k,
    random_subset,
    rank_power,
    rank_power_indices,
    rank_power_log_weights,
    top_k,
)

__all__ = [
    "Selection",
    "ascending_order",
    "check_keep",
    "gumbel_top_k",
    "kept_count",
    "nan_as_inf",
    "random_subset",
    "rank_power",
    "rank_power_indices",
    "rank_power_log_weights",
    "ranks",
    "top_k",
]
