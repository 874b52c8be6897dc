"""Per-sample gradients, squared norms and moments of a per-sample loss, on a chosen subset.

``batch_grad``, ``batch_l2_grad``, ``sum_grad_squared`` and ``variance`` turn a
:class:`~sbfunc.module.LossFn` into ``f(params, buffers, batch, *, subsampling, chunk_size)``
(BackPACK's first-order extensions as pure functions, with sub-sampling for all four).
"""

from sbfunc.per_sample.engine import check_subsampling
from sbfunc.per_sample.fallback import VmapFallbackWarning
from sbfunc.per_sample.transforms import (
    PerSampleTransform,
    SquaredNorms,
    batch_grad,
    batch_l2_grad,
    sum_grad_squared,
    variance,
)

__all__ = [
    "PerSampleTransform",
    "SquaredNorms",
    "VmapFallbackWarning",
    "batch_grad",
    "batch_l2_grad",
    "check_subsampling",
    "sum_grad_squared",
    "variance",
]
