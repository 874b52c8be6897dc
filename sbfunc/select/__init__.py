"""Select: the selection type, the kept count, ranks and the sampling maths the policies of
:mod:`sbfunc.policies` are built from (with explicit randomness)."""

from sbfunc._namespace import api_dir
from sbfunc.select.base import Selection, kept_count, nonfinite_lowest, ranks
from sbfunc.select.diverse import divbs_indices, gradient_gram, last_layer_errors
from sbfunc.select.samplers import gumbel_top_k, rank_power_log_weights

__all__ = [
    "Selection",
    "divbs_indices",
    "gradient_gram",
    "gumbel_top_k",
    "kept_count",
    "last_layer_errors",
    "nonfinite_lowest",
    "rank_power_log_weights",
    "ranks",
]


__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
