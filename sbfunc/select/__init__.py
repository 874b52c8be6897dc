"""Select: the selection type, the kept count, ranks and the sampling building blocks the
policies of :mod:`sbfunc.policies` are built from (with explicit randomness).

Every draw follows one non-finite rule: rows with a non-finite score come after every finite
one (:func:`nonfinite_lowest`), in a random order, so they are kept only to fill a fixed count.
Each rule's own maths (rank-power weights, DivBS's greedy, ...) lives beside its policy.
"""

from sbfunc._namespace import api_dir, moved_names
from sbfunc.select._base import (
    Selection,
    ascending_lowest,
    ascending_order,
    check_keep,
    distinct_order,
    finite_split,
    kept_count,
    nonfinite_lowest,
    ranks,
)
from sbfunc.select._samplers import (
    gumbel_top_k,
    perturbed,
    random_indices,
    sorted_unique,
    top_k_indices,
)

__all__ = [
    "Selection",
    "ascending_lowest",
    "ascending_order",
    "check_keep",
    "distinct_order",
    "finite_split",
    "gumbel_top_k",
    "kept_count",
    "nonfinite_lowest",
    "perturbed",
    "random_indices",
    "ranks",
    "sorted_unique",
    "top_k_indices",
]

__getattr__ = moved_names(
    "sbfunc.select",
    (
        "1.1",
        (
            "sbfunc.policies",
            ("divbs_indices", "gradient_gram", "last_layer_errors", "rank_power_log_weights"),
        ),
    ),
)
__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
