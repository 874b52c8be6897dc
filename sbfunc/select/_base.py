"""The selection type, the kept count and rank computation shared by all selection rules.

**Non-finite scores** follow one rule on every selection path (:func:`ranks`,
:func:`gumbel_top_k`, every policy of :mod:`sbfunc.policies` with a fixed or a variable kept
count, the data-parallel wrappers of :mod:`sbfunc.distributed`, Selective Backprop's refill
queue, the Composer-compatible ``select_using_loss``): a NaN, ``+inf`` or ``-inf`` score ranks
**below every finite score** (:func:`nonfinite_lowest` maps them all to ``-inf``), and ties
among them are broken at random by the key like any other tie. So a row the model cannot
score is never kept while finite rows remain; a fixed-count rule keeps ``k`` rows (static
shapes), so when fewer than ``k`` rows are finite some non-finite rows fill the rest, and the
training step gives non-finite rows no weight. All-NaN (or all-equal) scores give a uniformly
random selection. Policies keep their histories and tables finite: a non-finite score is never
recorded.

**Empty batches**: scores of zero rows give an empty :class:`Selection` (and leave a policy's
state unchanged); the step then makes no update and counts the batch as skipped.
"""

from __future__ import annotations

import itertools
import math
import operator
from typing import NamedTuple

import torch

from sbfunc import random as sbrandom
from sbfunc._finite import finite_entries
from sbfunc._tracing import host_readable
from sbfunc.validation import check_fraction

__all__ = [
    "Selection",
    "check_keep",
    "distinct_order",
    "kept_count",
    "nonfinite_lowest",
    "ranks",
]


class Selection(NamedTuple):
    """The outcome of a selection rule.

    Attributes:
        indices: ``Tensor[k]`` of ``int64`` row indices, unique and sorted ascending (so the
            pruned batch keeps the original order), on the scores' device.
        weights: ``Tensor[k]`` of per-sample loss weights aligned with ``indices`` (importance
            weights of unbiased samplers), or ``None`` for an unweighted mean.

    Example:
        >>> sel = sbfunc.select.Selection(torch.tensor([0, 2]))
        >>> sbfunc.batch.take((torch.arange(3.0), torch.tensor([7, 8, 9])), sel.indices)
        (tensor([0., 2.]), tensor([7, 9]))
        >>> sel.weights is None
        True

    References:
        Jiang et al. 2019, "Accelerating Deep Learning by Focusing on the Biggest Losers";
        Katharopoulos and Fleuret 2018, "Not All Samples Are Created Equal: Deep Learning with
        Importance Sampling" (importance weights).
    """

    indices: torch.Tensor
    weights: torch.Tensor | None = None


def check_keep(keep: float) -> float:
    """Validate ``keep`` in (0, 1] and return it as a float (see :mod:`sbfunc.validation`).

    Raises:
        TypeError: for anything but an int or a float (a bool, a str).
        ValueError: for NaN or a value outside (0, 1].

    Example:
        >>> sbfunc.select.check_keep(0.25)
        0.25
    """
    return check_fraction(
        keep, "keep", open_low=True, fix="keep is the fraction of rows kept, e.g. 0.5"
    )


def kept_count(n: int, keep: float) -> int:
    """Number of samples kept out of ``n``: ``max(1, floor(keep * n))``, as the decimal reads
    (0 for an empty batch).

    ``keep`` counts as the decimal it prints as (``0.29`` is 29/100, not the binary float
    0.28999999999999998), so ``kept_count(100, 0.29) == 29`` where ``int(0.29 * 100)`` gives 28:
    the product is nudged up by a relative ``2**-50`` (four units in the last place) before the
    floor, which recovers every product of a short decimal and an int, and is plain arithmetic
    that ``torch.compile`` traces (no host call, no graph break).

    Args:
        n: batch size, >= 0.
        keep: fraction in (0, 1].

    Raises:
        TypeError: for an ``n`` that is not an int.
        ValueError: for ``n < 0`` (and as :func:`check_keep`).

    Example:
        >>> from sbfunc.select import kept_count
        >>> kept_count(100, 0.29), kept_count(1, 0.5), kept_count(0, 0.5)
        (29, 1, 0)
    """
    keep = check_keep(keep)
    if isinstance(n, bool) or not isinstance(n, int | torch.SymInt):
        raise TypeError(f"n (the batch size) must be an int >= 0, got {n!r}")
    if n < 0:
        raise ValueError(f"n (the batch size) must be an int >= 0, got {n!r}")
    if n == 0:
        return 0
    return max(1, math.floor(keep * n * _NUDGE))


_NUDGE = 1.0 + 2.0**-50


def nonfinite_lowest(scores: torch.Tensor) -> torch.Tensor:
    """``scores`` with every non-finite entry (NaN, ``+inf``, ``-inf``) replaced by ``-inf``:
    the non-finite rule of every selection path (see :mod:`sbfunc.select`), non-finite
    rows rank below every finite one. Integer scores come back unchanged.

    Args:
        scores: a tensor of scores.

    Returns:
        A tensor of the same shape and dtype.

    Example:
        >>> sbfunc.select.nonfinite_lowest(torch.tensor([1.0, float("nan"), float("inf")]))
        tensor([1., -inf, -inf])
    """
    if not scores.dtype.is_floating_point:
        return scores
    return torch.where(finite_entries(scores), scores, -torch.inf)


def finite_split(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | int]:
    """``(nonfinite_lowest(scores), count)``, the scores with every non-finite one replaced by
    ``-inf`` and how many there are (a 0-d ``int64`` tensor), from one finiteness mask. The
    int 0 when no score can be non-finite (an integer dtype), or eagerly on the CPU when
    reading the mask shows that none is: the scores come back as they are then, and the
    callers skip the selects that place non-finite rows (the common case)."""
    if not scores.dtype.is_floating_point:
        return scores, 0
    finite = finite_entries(scores)
    if host_readable(finite) and bool(finite.all()):
        return scores, 0
    return torch.where(finite, scores, -torch.inf), (~finite).sum()


def distinct_order(scores: torch.Tensor) -> torch.Tensor | None:
    """The ascending order of ``scores`` when no tie can arise, eagerly on the CPU: every
    score finite and no two equal (``-0.0`` equals ``0.0``), read from one sort (a ``topk`` of
    every row: ties, where its order would be arbitrary, are refused anyway). Tie-breaking
    noise cannot change that order, so a caller need not draw it: the selection is the one
    the noise would give, bit for bit.

    Args:
        scores: ``Tensor[N]``.

    Returns:
        ``int64 Tensor[N]``, the permutation that sorts ``scores`` ascending, or ``None`` (a
        tie, a non-finite score, integer scores, an accelerator, tracing): then the caller
        breaks the ties with noise (:func:`ascending_order`).

    Example:
        >>> sbfunc.select.distinct_order(torch.tensor([0.3, 0.1, 0.2]))
        tensor([1, 2, 0])
        >>> sbfunc.select.distinct_order(torch.tensor([0.3, 0.1, 0.3])) is None
        True

    References:
        SciPy ``rankdata(method="ordinal")``: with no tie, every tie rule gives this order.
    """
    if not (scores.dtype.is_floating_point and host_readable(scores)):
        return None
    n = scores.shape[0]
    values, order = torch.topk(scores, n, largest=False)  # ascending (one op where sort is 8)
    v = values.tolist()
    if n and not (math.isfinite(v[0]) and math.isfinite(v[-1])):
        return None
    # strictly increasing: no two equal, and no NaN anywhere (every comparison with it fails)
    return order if all(map(operator.lt, v, itertools.islice(v, 1, None))) else None


def _monotone_int(scores: torch.Tensor) -> torch.Tensor:
    """Map float32 values to int64 with the same order (IEEE-754 bit trick); -0.0 == 0.0.
    ``scores`` must hold no NaN or ``+inf`` (:func:`nonfinite_lowest`: the caller's)."""
    x = scores.to(torch.float32) + 0.0
    bits = x.view(torch.int32)
    return torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(torch.int64)


_EXACT_IN_FLOAT32 = (torch.float32, torch.float16, torch.bfloat16)


def ranks(
    scores: torch.Tensor,
    *,
    key: sbrandom.Key | None = None,
    tie_noise: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rank of every score, 0 for the lowest, with ties broken uniformly at random.

    Ties are broken by random integers drawn from ``key`` (or given as ``tie_noise``, an int64
    ``Tensor[N]`` of i.i.d. values in ``[0, 2**32)``, see :func:`sbfunc.random.bits`); with
    neither, by position (stable sort). Non-finite scores (NaN, ``+inf``, ``-inf``) tie with
    each other below every finite score (see :mod:`sbfunc.select`). For
    float32/16 scores one sort of a packed 64-bit (score, noise) key does both jobs; other
    dtypes take a random permutation and a stable sort. Runs on the scores' device without a
    host sync.

    Args:
        scores: ``Tensor[N]``.
        key: an :mod:`sbfunc.random` key for the ties.
        tie_noise: or the ties' noise itself.

    Returns:
        ``int64 Tensor[N]``, a permutation of ``0..N-1``.

    Raises:
        ValueError: if ``scores`` is not 1-D.

    Example:
        >>> sbfunc.select.ranks(torch.tensor([0.3, 0.1, 0.2]))
        tensor([2, 0, 1])
        >>> sbfunc.select.ranks(torch.tensor([float("nan"), 5.0, -float("inf"), 0.0]))
        tensor([0, 3, 1, 2])

    References:
        MosaicML Composer ``select_using_loss`` (ascending ``argsort`` of the losses); SciPy
        ``rankdata(method="ordinal")`` (1-based, ties by position, like no key here); Herf 2001,
        "Radix Tricks" (the order-preserving float-to-integer bit map).
    """
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D [N], got shape {tuple(scores.shape)}")
    n = scores.shape[0]
    if key is not None:
        tie_noise = sbrandom.bits(key, (n,), device=scores.device)
    order = ascending_order(scores, tie_noise)
    out = torch.empty_like(order)
    out[order] = torch.arange(n, device=scores.device)
    return out


def ascending_order(scores: torch.Tensor, tie_noise: torch.Tensor | None) -> torch.Tensor:
    """The permutation that sorts ``scores`` ascending, ties broken by ``tie_noise`` (by
    position when ``None``); non-finite scores tie below every finite one and come first.
    :func:`ranks` is its inverse permutation.

    Example:
        >>> sbfunc.select.ascending_order(torch.tensor([0.3, 0.1, 0.2]), None)
        tensor([1, 2, 0])

    References:
        Herf 2001, "Radix Tricks" (the order-preserving float-to-integer bit map).
    """
    return ascending_lowest(nonfinite_lowest(scores), tie_noise)


def ascending_lowest(lowest: torch.Tensor, tie_noise: torch.Tensor | None) -> torch.Tensor:
    """:func:`ascending_order` of scores whose non-finite entries are ``-inf`` already
    (:func:`nonfinite_lowest`, :func:`finite_split`)."""
    if tie_noise is None:
        return torch.argsort(lowest, stable=True)
    if lowest.dtype in _EXACT_IN_FLOAT32:  # one sort of a packed (score, noise) int64 key
        return torch.argsort(_monotone_int(lowest) * 2**32 + tie_noise, stable=True)
    perm = torch.argsort(tie_noise, stable=True)
    return perm[torch.argsort(lowest[perm], stable=True)]
