"""Select: the selection type, the kept count, ranks and the sampling maths the policies of
:mod:`sbfunc.policies` are built from (with explicit randomness)."""

from sbfunc.select.base import Selection, check_keep, kept_count, nonfinite_lowest, ranks
from sbfunc.select.samplers import gumbel_top_k, rank_power_log_weights

__all__ = [
    "Selection",
    "check_keep",
    "gumbel_top_k",
    "kept_count",
    "nonfinite_lowest",
    "rank_power_log_weights",
    "ranks",
]


def __dir__() -> list[str]:  # dir() lists the public API, not the module's imports
    return sorted(__all__)
