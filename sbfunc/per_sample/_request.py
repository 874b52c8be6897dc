"""A validated curvature request and its chunks: the criterion and reduction, sub-sampling
indices (order and repeats kept, as BackPACK's ``subsampling``), and the chunks of the selected
samples that :mod:`sbfunc.per_sample` runs one at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from sbfunc.batch import batch_size, check_per_sample, take
from sbfunc.module import ModuleLoss, check_state
from sbfunc.per_sample._engine import check_subsampling, check_wrt, resolve_wrt
from sbfunc.per_sample._loss_hessian import Kind, criterion_kind
from sbfunc.types import Params, PerSample
from sbfunc.validation import check_choice, check_int, describe

__all__ = ["Chunk", "Curvature", "check_curvature_output", "chunks", "curvature", "select"]


class Curvature(NamedTuple):
    """A validated curvature request: the loss, its criterion, the reduction of the batch loss,
    ``M`` (``None``: exact) and which parameters.

    Example:
        >>> loss_fn = sbfunc.per_sample_loss(torch.nn.Linear(2, 2), torch.nn.functional.mse_loss)
        >>> curvature(loss_fn, reduction="sum", mc_samples=None, wrt=None, per_sample=None).kind
        'mse'

    References:
        Dangel et al. 2020, "BackPACK" (``SqrtGGNExact``, ``SqrtGGNMC``).
    """

    loss_fn: ModuleLoss
    kind: Kind
    reduction: str
    mc_samples: int | None
    wrt: tuple[str, ...] | None
    per_sample: PerSample


def curvature(
    loss_fn: Any,
    *,
    reduction: str,
    mc_samples: int | None,
    wrt: Sequence[str] | None,
    per_sample: PerSample,
) -> Curvature:
    """Validate the construction arguments of a curvature transform.

    Args:
        loss_fn: a :class:`~sbfunc.module.ModuleLoss` from :func:`sbfunc.per_sample_loss`.
        reduction: ``"mean"`` or ``"sum"``.
        mc_samples: ``M >= 1`` for Monte-Carlo factors, ``None`` for exact ones.
        wrt: parameter names or module prefixes (default: all).
        per_sample: which leaves of the batch are per-sample (:data:`sbfunc.types.PerSample`).

    Returns:
        A :class:`Curvature`.

    Raises:
        TypeError: if ``loss_fn`` is not a ``ModuleLoss``, for a malformed ``wrt``,
            ``per_sample`` or ``mc_samples``.
        ValueError: for an unsupported criterion or reduction, ``mc_samples < 1``.

    Example:
        >>> curvature(lambda p, b, x: x, reduction="mean", mc_samples=None, wrt=None,
        ...           per_sample=None)
        Traceback (most recent call last):
        ...
        TypeError: loss_fn must be a ModuleLoss made by sbfunc.per_sample_loss(model, ...

    References:
        Dangel et al. 2020, "BackPACK" (the supported losses).
    """
    if not isinstance(loss_fn, ModuleLoss):
        raise TypeError(
            "loss_fn must be a ModuleLoss made by sbfunc.per_sample_loss(model, criterion) (the "
            f"GGN needs the model output and the criterion separately), got {describe(loss_fn)}"
        )
    kind = criterion_kind(loss_fn.raw_criterion)
    check_choice(reduction, "reduction", ("mean", "sum"))
    if mc_samples is not None:
        check_int(mc_samples, "mc_samples", low=1)
    check_per_sample(per_sample)
    return Curvature(loss_fn, kind, reduction, mc_samples, check_wrt(wrt), per_sample)


def select(subsampling: Any, n: int) -> torch.Tensor | None:
    """Sub-sampling indices as int64, in the given order and with repeats kept (as BackPACK's
    ``subsampling``), each checked to lie in ``[0, n)``.

    Args:
        subsampling: ``None``, a list/tuple of ints or a 1-D integer tensor.
        n: the batch size.

    Returns:
        ``None`` or ``Tensor[S]``.

    Raises:
        TypeError: for non-integer indices.
        ValueError: for an empty or non-1-D list, or an index outside ``[0, n)``
            (:func:`~sbfunc.per_sample._engine.check_subsampling`, shared with the first-order
            transforms).

    Example:
        >>> select([0, 3, 3], 4)
        tensor([0, 3, 3])
    """
    return None if subsampling is None else check_subsampling(subsampling, n)


def check_curvature_output(c: Curvature, out: Any, m: int) -> None:
    """Check that the model output is a tensor ``[m, ...]`` (``[m, C, ...]`` for cross-entropy).

    Args:
        c: the request.
        out: the model output of a chunk.
        m: the chunk's size.

    Raises:
        ValueError: for another output (a non-tensor, another leading size, 1-D logits for
            cross-entropy).

    Example:
        >>> loss_fn = sbfunc.per_sample_loss(torch.nn.Identity(), torch.nn.functional.mse_loss)
        >>> c = curvature(loss_fn, reduction="mean", mc_samples=None, wrt=None, per_sample=None)
        >>> check_curvature_output(c, torch.zeros(3, 2), 4)
        Traceback (most recent call last):
        ...
        ValueError: the model output must be a tensor [4, ...] for a chunk of 4 samples, got ...
    """
    if not isinstance(out, torch.Tensor) or out.dim() < 1 or out.shape[0] != m:
        raise ValueError(
            f"the model output must be a tensor [{m}, ...] for a chunk of {m} samples, got "
            f"{describe(out)}"
        )
    if c.kind == "cross_entropy" and out.dim() < 2:
        raise ValueError(f"cross-entropy needs logits [N, C, ...], got shape {tuple(out.shape)}")


class Chunk(NamedTuple):
    """A chunk of the selected samples: its batch, size ``m``, position ``start`` in the
    selection, the selection's size ``s`` and the whole batch's size ``n``.

    Example:
        >>> Chunk(torch.zeros(2, 3), 2, 0, 2, 10).m
        2
    """

    batch: Any
    m: int
    start: int
    s: int
    n: int


def chunks(
    c: Curvature,
    params: Params,
    buffers: Params,
    batch: Any,
    subsampling: Any,
    chunk_size: int | None,
) -> tuple[list[str], list[Chunk]]:
    """Validate and resolve the call arguments: the differentiated names and the chunks.

    Args:
        c: the request (:func:`curvature`).
        params: parameters.
        buffers: buffers.
        batch: a pytree batch of ``N`` samples.
        subsampling: indices (:func:`select`) or ``None``.
        chunk_size: at most this many samples per chunk, or ``None``.

    Returns:
        ``(names, chunks)``.

    Raises:
        TypeError: for non-integer indices, or dicts that are not of tensors.
        ValueError: for ``params``/``buffers`` that do not match the loss's module (checked
            first: :func:`sbfunc.module.check_state`), a bad ``chunk_size``, indices or
            ``wrt`` names.

    Example:
        >>> model = torch.nn.Linear(3, 2)
        >>> c = curvature(sbfunc.per_sample_loss(model, torch.nn.functional.mse_loss),
        ...               reduction="mean", mc_samples=None, wrt=["bias"], per_sample=None)
        >>> names, parts = chunks(c, *sbfunc.split_module(model), (torch.ones(5, 3),
        ...                       torch.ones(5, 2)), [4, 0, 0], 2)
        >>> names, [(p.m, p.start, p.s, p.n) for p in parts]
        (['bias'], [(2, 0, 3, 5), (1, 2, 3, 5)])
    """
    check_state(c.loss_fn, params, buffers)
    if chunk_size is not None:
        check_int(chunk_size, "chunk_size", low=1, fix="or None for one chunk")
    names = resolve_wrt(c.wrt, params)
    n = batch_size(batch, per_sample=c.per_sample)
    idx = select(subsampling, n)
    rows = torch.arange(n) if idx is None else idx
    s = rows.numel()
    step = s if chunk_size is None else chunk_size
    parts = []
    for start in range(0, s, step):
        part = rows[start : start + step]
        whole = idx is None and part.numel() == n
        piece = batch if whole else take(batch, part, per_sample=c.per_sample)
        parts.append(Chunk(piece, part.numel(), start, s, n))
    return names, parts
