"""The papers' equal-backprop-batch protocol: the loader supplies more candidate rows than the
step backpropagates, so the backprop batch keeps the size the hardware wants."""

from __future__ import annotations

import math

from sbfunc.select import check_keep, kept_count
from sbfunc.validation import check_int

__all__ = ["candidate_batch_size"]


def candidate_batch_size(backprop_batch: int, keep: float) -> int:
    """How many candidate rows, ``backprop_batch / keep`` rounded, a selection keeping ``keep``
    needs to keep exactly ``backprop_batch`` rows (``kept_count(n, keep) == backprop_batch``):
    load batches of this size and Selective Backprop backpropagates batches as large as plain
    training's.

    Jiang et al. (2019) accumulate selected rows until a full batch is formed, and airbench
    backpropagates 512 of 1024 candidates: selection saves the backward of the dropped rows
    without shrinking the batch the backward runs on, which a small backprop batch cannot keep
    busy (issue 37 measured half-size backprop batches leaving 2 CPU cores idle). With a
    fixed-count policy (rank-power, top-k, uniform, RHO-LOSS, DivBS, Bayesian) every step then
    backpropagates exactly ``backprop_batch`` rows; an epoch has ``keep`` times as many steps as
    plain training's, each forwarding ``1 / keep`` times as many rows through the scoring pass.

    Args:
        backprop_batch: the rows each step backpropagates, ``>= 1``.
        keep: the kept fraction, in (0, 1].

    Returns:
        ``ceil(backprop_batch / keep)``, adjusted down while it still keeps enough rows.

    Raises:
        TypeError, ValueError: for arguments out of range.

    Example:
        >>> sbfunc.selective_backprop.candidate_batch_size(64, 0.5)
        128
        >>> n = sbfunc.selective_backprop.candidate_batch_size(64, 0.3)
        >>> n, sbfunc.select.kept_count(n, 0.3)
        (214, 64)

    References:
        Jiang et al. 2019, "Accelerating Deep Learning by Focusing on the Biggest Losers"
        (fixed-size backprop batches); Keller Jordan's airbench (512 of 1024 candidates).
    """
    backprop_batch = check_int(backprop_batch, "backprop_batch", low=1)
    keep = check_keep(keep)
    n = math.ceil(backprop_batch / keep)
    while kept_count(n, keep) > backprop_batch:  # rounding of keep * n
        n -= 1
    while kept_count(n, keep) < backprop_batch:
        n += 1
    return n
