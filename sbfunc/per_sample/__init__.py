"""Per-sample gradients, squared norms and moments of a per-sample loss, on a chosen subset.

``batch_grad``, ``batch_l2_grad``, ``sum_grad_squared`` and ``variance`` turn a
:class:`~sbfunc.types.LossFn` into a :class:`PerSampleTransform`, ``f(params, buffers, batch, *,
subsampling, chunk_size, key)`` (BackPACK's first-order extensions as pure functions, with
sub-sampling for all four); every transform here has that one shape, the Monte-Carlo ones
requiring ``key``.

Curvature on a subset: ``sqrt_ggn_exact`` and ``sqrt_ggn_mc`` (BackPACK's ``SqrtGGNExact`` /
``SqrtGGNMC`` layouts), the GGN diagonal and its per-sample version (``diag_ggn_exact``,
``diag_ggn_mc``, ``batch_diag_ggn_exact``, ``batch_diag_ggn_mc``), ``ggn_vector_product`` and
the leading eigenpairs ``ggn_eigen`` (ViViT), for cross-entropy, MSE and binary cross-entropy
with logits.
"""

from sbfunc._namespace import api_dir, moved_names
from sbfunc.per_sample._eigen import GGNEigen, ggn_eigen
from sbfunc.per_sample._fallback import VmapFallbackWarning
from sbfunc.per_sample._ggn import (
    batch_diag_ggn_exact,
    batch_diag_ggn_mc,
    diag_ggn_exact,
    diag_ggn_mc,
    ggn_vector_product,
)
from sbfunc.per_sample._sqrt_ggn import sqrt_ggn_exact, sqrt_ggn_mc
from sbfunc.per_sample._transforms import (
    PerSampleTransform,
    SquaredNorms,
    batch_grad,
    batch_l2_grad,
    sum_grad_squared,
    variance,
)

__all__ = [
    "GGNEigen",
    "PerSampleTransform",
    "SquaredNorms",
    "VmapFallbackWarning",
    "batch_diag_ggn_exact",
    "batch_diag_ggn_mc",
    "batch_grad",
    "batch_l2_grad",
    "diag_ggn_exact",
    "diag_ggn_mc",
    "ggn_eigen",
    "ggn_vector_product",
    "sqrt_ggn_exact",
    "sqrt_ggn_mc",
    "sum_grad_squared",
    "variance",
]

__getattr__ = moved_names(  # one shape for every transform: the key is a keyword of each
    "sbfunc.per_sample", ("1.2", {"KeyedTransform": "sbfunc.per_sample:PerSampleTransform"})
)
__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
