"""Rows of several tensors as one byte matrix, so that one collective moves them all.

A batch (or the scores and ids of a batch) is several tensors that share their first axis,
with different dtypes and row shapes. :func:`pack_rows` views every row of every tensor as
bytes and lays them side by side in one ``uint8 [N, B]`` matrix; :func:`unpack_rows` undoes
it. Moving rows between ranks then takes one ``all_gather`` or ``all_to_all`` instead of one
per tensor, and the byte count of the traffic is plain to read.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from sbfunc._rows import path_str, walk

__all__ = ["RowLayout", "batch_rows", "pack_rows", "unpack_rows", "with_rows"]


class RowLayout(NamedTuple):
    """How :func:`pack_rows` laid out the tensors: their dtypes and per-row shapes.

    Example:
        >>> from sbfunc.distributed import pack_rows
        >>> pack_rows([torch.zeros(3, 2), torch.zeros(3, dtype=torch.int64)])[1].row_bytes
        16
    """

    dtypes: tuple[torch.dtype, ...]
    shapes: tuple[tuple[int, ...], ...]

    @property
    def widths(self) -> tuple[int, ...]:
        """Bytes per row of each tensor."""
        return tuple(
            math.prod(s) * torch.empty((), dtype=d).element_size()
            for d, s in zip(self.dtypes, self.shapes, strict=True)
        )

    @property
    def row_bytes(self) -> int:
        """Bytes per packed row."""
        return sum(self.widths)


def pack_rows(tensors: Sequence[torch.Tensor]) -> tuple[torch.Tensor, RowLayout]:
    """The rows of ``tensors`` (same first axis ``N``, same device) as one ``uint8 [N, B]``.

    Raises:
        ValueError: for no tensors, or tensors of rank 0 or disagreeing on ``N``.

    Example:
        >>> from sbfunc.distributed import pack_rows, unpack_rows
        >>> x, ids = torch.tensor([[1.5, 2.0], [3.0, 4.0]]), torch.tensor([7, 9])
        >>> packed, layout = pack_rows([x, ids])
        >>> packed.shape, packed.dtype
        (torch.Size([2, 16]), torch.uint8)
        >>> unpack_rows(packed, layout)[1]
        tensor([7, 9])
    """
    if not tensors or any(t.dim() == 0 for t in tensors):
        raise ValueError("pack_rows needs one or more tensors of rank >= 1")
    n = tensors[0].shape[0]
    if any(t.shape[0] != n for t in tensors):
        raise ValueError(
            f"pack_rows: tensors disagree on the first axis: {[t.shape[0] for t in tensors]}"
        )
    layout = RowLayout(tuple(t.dtype for t in tensors), tuple(tuple(t.shape[1:]) for t in tensors))
    cols = [
        t.reshape(n, math.prod(t.shape[1:])).contiguous().view(torch.uint8)
        if t.numel()
        else torch.empty((n, w), dtype=torch.uint8, device=t.device)
        for t, w in zip(tensors, layout.widths, strict=True)
    ]
    return torch.cat(cols, dim=1), layout


def unpack_rows(packed: torch.Tensor, layout: RowLayout) -> list[torch.Tensor]:
    """The tensors that :func:`pack_rows` packed into ``packed`` (any number of rows)."""
    m = packed.shape[0]
    parts = torch.split(packed, list(layout.widths), dim=1)
    return [
        p.clone(memory_format=torch.contiguous_format).view(d).reshape(m, *s)
        if p.numel()
        else torch.empty((m, *s), dtype=d, device=packed.device)
        for p, d, s in zip(parts, layout.dtypes, layout.shapes, strict=True)
    ]


def batch_rows(batch: Any) -> list[torch.Tensor]:
    """The per-sample leaves of a pytree batch (see :mod:`sbfunc.batch`), in order; they must
    be tensors to travel between ranks.

    Raises:
        TypeError: for a per-sample leaf that is not a tensor (a list of strings, an array).

    Example:
        >>> from sbfunc.distributed import batch_rows
        >>> len(batch_rows({"x": torch.zeros(2, 3), "y": torch.zeros(2), "tag": "train"}))
        2
    """
    rows: list[torch.Tensor] = []

    def visit(path: tuple[Any, ...], leaf: Any, size: int | None) -> Any:
        if size is not None:
            if not isinstance(leaf, torch.Tensor):
                raise TypeError(
                    f"{path_str(path)} is a per-sample {type(leaf).__name__}; only tensor rows "
                    "can move between ranks (rebalancing): make it a tensor or leave it out"
                )
            rows.append(leaf)
        return leaf

    walk(batch, None, visit, rebuild=False)
    return rows


def with_rows(batch: Any, rows: Sequence[torch.Tensor]) -> Any:
    """``batch`` with its per-sample leaves replaced, in order, by ``rows``.

    Example:
        >>> from sbfunc.distributed import with_rows
        >>> with_rows({"x": torch.zeros(2), "tag": "train"}, [torch.ones(1)])
        {'x': tensor([1.]), 'tag': 'train'}
    """
    it = iter(rows)
    return walk(
        batch, None, lambda p, leaf, size: leaf if size is None else next(it), rebuild=True
    )
