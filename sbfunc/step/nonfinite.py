"""A corrupt row costs one row: find the rows whose inputs are not finite and neutralise them.

One row of NaNs in an input poisons every gradient it touches (``0 * nan`` is ``nan`` in the
backward of a matrix product), so masking its loss is not enough: the step zeroes the row's
floating-point inputs before the forward and gives the row zero weight in the loss, so the
update equals the update on the finite rows alone (for models whose rows do not interact;
a train-mode BatchNorm still sees the zeroed row in its batch statistics). Shapes stay static
and nothing syncs. Rows whose *loss* is not finite (finite inputs) are left out of the loss in
the same way.
"""

from __future__ import annotations

from typing import Any

import torch

from sbfunc.batch import _flat_tensors
from sbfunc.rows import PerSample, walk
from sbfunc.select.base import finite_entries

__all__ = ["finite_rows", "zero_rows"]


def _float_rows(leaf: Any, size: int | None) -> bool:
    return size is not None and isinstance(leaf, torch.Tensor) and leaf.is_floating_point()


def finite_rows(batch: Any, *, per_sample: PerSample = None) -> torch.Tensor | None:
    """``Tensor[N]`` of bools: every floating-point per-sample tensor of the row is finite.

    Args:
        batch: any pytree batch.
        per_sample: which leaves are per-sample (:data:`sbfunc.batch.PerSample`).

    Returns:
        The mask, or ``None`` when the batch has no floating-point per-sample tensor.

    Example:
        >>> from sbfunc.step.nonfinite import finite_rows
        >>> finite_rows((torch.tensor([[1.0, 2.0], [float("nan"), 0.0]]), torch.tensor([0, 1])))
        tensor([ True, False])
    """
    found: list[torch.Tensor] = []

    def check(leaf: torch.Tensor) -> None:
        finite = finite_entries(leaf)
        found.append(finite.flatten(1).all(1) if leaf.dim() > 1 else finite)

    def visit(path: tuple[Any, ...], leaf: Any, size: int | None) -> Any:
        if _float_rows(leaf, size):
            check(leaf)
        return leaf

    flat = _flat(batch, per_sample)
    if flat is not None:  # the hot path: a tuple/list/dict of tensors, no tree walk
        for leaf in flat:
            if leaf.is_floating_point():
                check(leaf)
    else:
        walk(batch, per_sample, visit, rebuild=False)
    if not found:
        return None
    ok = found[0]
    for more in found[1:]:
        ok = ok & more
    return ok


def zero_rows(batch: Any, ok: torch.Tensor, *, per_sample: PerSample = None) -> Any:
    """``batch`` with the rows where ``ok`` is false zeroed in every floating-point per-sample
    tensor (a new batch; the input is not modified).

    Example:
        >>> from sbfunc.step.nonfinite import zero_rows
        >>> zero_rows((torch.tensor([[1.0], [float("inf")]]),), torch.tensor([True, False]))
        (tensor([[1.], [0.]]),)
    """

    def zero(leaf: torch.Tensor) -> torch.Tensor:
        if not leaf.is_floating_point():
            return leaf
        mask = ok.reshape(-1, *([1] * (leaf.dim() - 1)))
        return torch.where(mask, leaf, leaf.new_zeros(()))

    def visit(path: tuple[Any, ...], leaf: Any, size: int | None) -> Any:
        return zero(leaf) if _float_rows(leaf, size) else leaf

    if _flat(batch, per_sample) is not None:
        if type(batch) is dict:
            return {k: zero(t) for k, t in batch.items()}
        return type(batch)(zero(t) for t in batch)
    return walk(batch, per_sample, visit, rebuild=True)


def _flat(batch: Any, per_sample: PerSample) -> list[torch.Tensor] | None:
    """The tensors of a tuple/list/dict of per-sample tensors (the default rule), else
    ``None``."""
    if per_sample is not None or _flat_tensors(batch) < 0:
        return None
    return list(batch.values() if type(batch) is dict else batch)
