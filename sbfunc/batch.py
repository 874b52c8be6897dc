"""Batches as pytrees (the *prune* stage): batch size, fields, and row selection.

A *batch* is any optree pytree (tuple, list, dict, namedtuple, nested) whose tensor leaves of
rank >= 1 are *per-sample*: they share the leading dimension ``N``. Non-tensor leaves (strings,
ints, ``None``) and 0-d tensors are treated as batch-wide metadata and pass through unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

import optree
import torch

__all__ = ["Field", "batch_size", "extract", "replace", "take"]

Field = int | str | Callable[[Any], Any]
"""Where a field sits in a batch: int (tuple/list), str (mapping) or ``batch -> value``."""

Batch = TypeVar("Batch")


def _is_per_sample(leaf: Any) -> bool:
    return isinstance(leaf, torch.Tensor) and leaf.dim() >= 1


def _path_str(path: tuple[Any, ...]) -> str:
    return "batch" + "".join(f"[{p!r}]" for p in path)


def batch_size(batch: Any) -> int:
    """Number of samples in a pytree batch (the shared leading dimension of its tensor leaves).

    Args:
        batch: a tensor or any optree pytree of tensors and metadata.

    Returns:
        The leading dimension ``N`` shared by every tensor leaf of rank >= 1 (a Python int read
        from the shape, so no device sync).

    Raises:
        ValueError: if the batch has no tensor leaf of rank >= 1, or its leaves disagree on the
            leading dimension (the message names every leaf and its size).

    Example:
        >>> sbfunc.batch_size({"x": torch.zeros(4, 3), "y": torch.zeros(4), "name": "mnist"})
        4

    References:
        MosaicML Composer ``DataSpec.get_num_samples_in_batch`` (its default reads dim 0 of the
        batch's tensors); optree ``tree_flatten_with_path``.
    """
    paths, leaves, _ = optree.tree_flatten_with_path(batch)
    sizes = {
        _path_str(p): leaf.shape[0]
        for p, leaf in zip(paths, leaves, strict=False)
        if _is_per_sample(leaf)
    }
    if not sizes:
        raise ValueError(
            "batch has no per-sample tensor leaf (a tensor of rank >= 1); "
            f"got leaves of types {[type(x).__name__ for x in leaves]}"
        )
    distinct = set(sizes.values())
    if len(distinct) > 1:
        detail = ", ".join(f"{name}: {n}" for name, n in sizes.items())
        raise ValueError(
            f"batch leaves disagree on the leading (sample) dimension: {detail}; every tensor "
            "leaf of rank >= 1 must have the same size along dim 0"
        )
    return distinct.pop()


def take(batch: Batch, indices: torch.Tensor) -> Batch:
    """Select rows ``indices`` along dim 0 of every per-sample leaf of a pytree batch.

    The structure of ``batch`` is preserved (a dict stays a dict, a namedtuple keeps its type),
    metadata leaves pass through, and the input is never modified.

    Args:
        batch: any pytree batch (see :func:`batch_size`).
        indices: a 1-D integer tensor of row indices (on the batch's device, to avoid copies).

    Returns:
        A new batch of ``len(indices)`` samples.

    Raises:
        ValueError: if ``indices`` is not 1-D, or the leaves disagree on the leading dimension.
        TypeError: if ``indices`` is not an integer tensor.

    Example:
        >>> batch = {"x": torch.arange(6.).reshape(3, 2), "y": torch.tensor([0, 1, 2])}
        >>> sbfunc.take(batch, torch.tensor([0, 2]))
        {'x': tensor([[0., 1.], [4., 5.]]), 'y': tensor([0, 2])}

    References:
        optree ``tree_map``; PyTorch ``torch.index_select``; MosaicML Composer
        ``select_using_loss`` (which prunes ``input[idx]`` and ``target[idx]`` only).
    """
    if not isinstance(indices, torch.Tensor):
        raise TypeError(f"indices must be a 1-D integer tensor, got {type(indices).__name__}")
    if indices.dim() != 1:
        raise ValueError(f"indices must be 1-D, got shape {tuple(indices.shape)}")
    if indices.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"indices must have an integer dtype (int64, int32), got {indices.dtype}")
    batch_size(batch)  # validates the leading dimensions, raising a clear error
    pruned = optree.tree_map(
        lambda leaf: (
            leaf.index_select(0, indices.to(leaf.device)) if _is_per_sample(leaf) else leaf
        ),
        batch,  # type: ignore[arg-type]
    )
    return cast(Batch, pruned)


def extract(batch: Any, key: Field, what: str = "key") -> Any:
    """Read one field of a batch: an ``int`` indexes a tuple/list, a ``str`` a mapping (or names
    a namedtuple field), and a callable is applied to the batch.

    Example:
        >>> sbfunc.extract({"image": 1, "label": 2}, "label")
        2

    References:
        MosaicML Composer ``composer.utils.batch_helpers.batch_get``.
    """
    if callable(key):
        return key(batch)
    if isinstance(key, bool):
        raise TypeError(f"{what} must be an int, str or callable, got bool")
    if isinstance(key, int):
        if not isinstance(batch, Sequence) or isinstance(batch, str):
            raise TypeError(
                f"{what}={key!r} indexes a tuple/list batch, but the batch is a "
                f"{type(batch).__name__}; pass a str key for dict batches"
            )
        if not -len(batch) <= key < len(batch):
            raise IndexError(f"{what}={key} is out of range for a batch of {len(batch)} fields")
        return batch[key]
    if isinstance(key, str):
        if hasattr(batch, "_fields") and key in batch._fields:
            return getattr(batch, key)
        if not isinstance(batch, Mapping):
            raise TypeError(
                f"{what}={key!r} indexes a dict batch, but the batch is a "
                f"{type(batch).__name__}; pass an int index for tuple batches"
            )
        if key not in batch:
            raise KeyError(
                f"{what}={key!r} not in batch; available keys: {sorted(map(str, batch))}"
            )
        return batch[key]
    raise TypeError(f"{what} must be an int, str or callable, got {type(key).__name__}")


def replace(batch: Batch, key: int | str, value: Any) -> Batch:
    """A copy of ``batch`` with one top-level field replaced; the input is not modified.

    ``key`` is an int for tuples, lists and namedtuples (the type is kept), a str for
    mappings (a ``dict`` copy is returned for any mapping) or a field name of a namedtuple.

    Example:
        >>> sbfunc.replace((1, 2), 1, 5), sbfunc.replace({"x": 1}, "x", 0)
        ((1, 5), {'x': 0})

    References:
        MosaicML Composer ``composer.utils.batch_helpers.batch_set`` (which sets lists and
        dicts in place; this returns a copy).
    """
    if callable(key) or isinstance(key, bool) or not isinstance(key, int | str):
        raise TypeError(f"key must be an int or str field to replace, got {key!r}")
    if isinstance(key, str) and hasattr(batch, "_fields"):  # namedtuple field by name
        if key not in batch._fields:
            raise KeyError(f"key {key!r} is not a field of {type(batch).__name__}")
        return batch._replace(**{key: value})  # type: ignore[attr-defined]
    extract(batch, key, "key")  # validates the key against the batch
    if isinstance(key, str):
        return {**batch, key: value}  # type: ignore[dict-item, return-value]
    items = list(batch)  # type: ignore[call-overload]
    items[key] = value
    if hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*items)
    return type(batch)(items)  # type: ignore[call-arg]
