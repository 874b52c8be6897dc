"""Batches as pytrees (the *prune* stage): batch size, fields, and row selection.

A *batch* is any pytree (tuple, list, dict or other mapping, namedtuple, optree node, nested)
whose *per-sample* leaves share the leading dimension ``N``. By default the per-sample leaves
are the tensors and NumPy arrays of rank >= 1 and the *row sequences*: plain lists/tuples that
hold no tensor or array of rank >= 1, such as the list of strings
``torch.utils.data.default_collate`` makes of a string field. A list/tuple holding tensors is a
node, so ``(x, y)`` is two leaves. 0-d tensors, scalars, strings, ``None`` and other objects are
batch-wide metadata and pass through. See :mod:`sbfunc` for the exact rule.

When the default guesses wrong (a ``[C]`` class-weight tensor with ``C == N``, a list of
per-image target dicts), say which leaves are per-sample with a ``per_sample`` spec
(:data:`PerSample`): a pytree prefix of the batch of ``True``/``False``/``None``/:data:`ROWS` or
a callable ``(path, leaf) -> bool``, as in Equinox's ``filter_spec``. Per-sample leaves that
disagree on ``N`` are an error, never a guess.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar, cast

import optree
import torch
import torch.utils._pytree as torch_pytree

from sbfunc._namespace import api_dir, moved_names
from sbfunc._rows import (
    batch_size,
    check_per_sample,
    disagree_error,
    flat_tensors,
    ndarray_type,
    no_rows_error,
    path_str,
    per_sample_sizes,
    rebuild_sequence,
    walk,
)
from sbfunc.types import PerSample
from sbfunc.validation import describe

__all__ = [
    "Field",
    "batch_device",
    "batch_size",
    "check_field",
    "check_per_sample",
    "check_same_spec",
    "extract",
    "per_sample_sizes",
    "replace",
    "strings_as_row_indices",
    "take",
]

Field = int | str | Callable[[Any], Any]
"""Where a field sits in a batch: int (tuple/list), str (mapping) or ``batch -> value``."""

BatchT = TypeVar("BatchT")


def batch_device(batch: Any) -> torch.device:
    """The device of the batch's first tensor (the CPU without one).

    Example:
        >>> sbfunc.batch.batch_device({"x": torch.zeros(2), "name": ["a", "b"]})
        device(type='cpu')
    """
    leaves = torch_pytree.tree_leaves(batch)
    return next((t.device for t in leaves if isinstance(t, torch.Tensor)), torch.device("cpu"))


def _fast_take(batch: Any, indices: torch.Tensor) -> Any:
    """``take`` on the hot path (a tensor, or a flat tuple/list/dict of tensors), else
    ``None``."""
    if type(batch) is torch.Tensor and batch.dim():
        return batch.index_select(0, indices.to(batch.device))
    if flat_tensors(batch) < 0:
        return None
    if type(batch) is dict:
        return {k: t.index_select(0, indices.to(t.device)) for k, t in batch.items()}
    return type(batch)(t.index_select(0, indices.to(t.device)) for t in batch)


def _take_rows(leaf: Any, indices: torch.Tensor, host: list[int]) -> Any:
    if isinstance(leaf, torch.Tensor):
        return leaf.index_select(0, indices.to(leaf.device))
    nd = ndarray_type()
    if nd is not None and isinstance(leaf, nd):
        return leaf[host]  # type: ignore[index]
    return rebuild_sequence(leaf, [leaf[i] for i in host])


def take(batch: BatchT, indices: torch.Tensor, *, per_sample: PerSample = None) -> BatchT:
    """Select rows ``indices`` of every per-sample leaf of a pytree batch.

    Tensors are indexed along dim 0 on their own device; NumPy arrays and row sequences
    (lists/tuples of per-sample values) are indexed on the host. Containers keep their types
    (a list stays a list, a tuple a tuple, a namedtuple or dict subclass its type where it can
    be rebuilt from its items, else a plain dict), metadata leaves and subtrees marked ``False``
    pass through as the same objects, and the input is never modified.

    A batch of tensors costs no host-device sync. A batch with NumPy or sequence leaves reads
    ``indices`` on the host once (``indices.tolist()``, a sync when they live on an
    accelerator).

    Args:
        batch: any pytree batch (see :func:`batch_size`).
        indices: a 1-D int64/int32 tensor of row indices (on the batch's device, to avoid
            copies); rows may repeat and come in any order.
        per_sample: which leaves are per-sample (:data:`PerSample`); ``None`` infers them.

    Returns:
        A new batch of ``len(indices)`` samples.

    Raises:
        ValueError: if ``indices`` is not 1-D, the batch has no per-sample leaf, or its
            per-sample leaves disagree on the leading dimension (see :func:`batch_size`).
        TypeError: if ``indices`` is not an integer tensor, or for a malformed ``per_sample``.

    Example:
        >>> batch = {"x": torch.arange(6.).reshape(3, 2), "y": torch.tensor([0, 1, 2]),
        ...          "text": ["a", "b", "c"], "split": "train"}
        >>> sbfunc.batch.take(batch, torch.tensor([0, 2]))
        {'x': tensor([[0., 1.], [4., 5.]]), 'y': tensor([0, 2]), 'text': ['a', 'c'],
         'split': 'train'}

        A ``[C]`` class-weight tensor with ``C == N`` only looks per-sample; say so:

        >>> batch = {"x": torch.zeros(3, 2), "class_weight": torch.tensor([1.0, 2.0, 3.0])}
        >>> sbfunc.batch.take(batch, torch.tensor([1]), per_sample={"class_weight": False})
        {'x': tensor([[0., 0.]]), 'class_weight': tensor([1., 2., 3.])}

    References:
        PyTorch ``torch.index_select`` and ``default_collate``; Equinox ``filter_spec``; MosaicML
        Composer ``select_using_loss`` (which prunes ``input[idx]`` and ``target[idx]`` only).
    """
    if not isinstance(indices, torch.Tensor):
        raise TypeError(f"indices must be a 1-D integer tensor, got {type(indices).__name__}")
    if indices.dim() != 1:
        raise ValueError(f"indices must be 1-D, got shape {tuple(indices.shape)}")
    if indices.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"indices must have an integer dtype (int64, int32), got {indices.dtype}")
    if per_sample is None:
        fast = _fast_take(batch, indices)
        if fast is not None:
            return cast(BatchT, fast)
    sizes: dict[str, int] = {}
    host: list[list[int]] = []  # indices on the host, read once if a leaf needs them

    def visit(path: tuple[Any, ...], leaf: Any, size: int | None) -> Any:
        if size is None:
            return leaf
        sizes[path_str(path)] = size
        if size != next(iter(sizes.values())):
            return leaf  # reported below, with every leaf's size
        if not host and not isinstance(leaf, torch.Tensor):
            host.append(indices.tolist())  # the documented sync: only for non-tensor leaves
        return _take_rows(leaf, indices, host[0] if host else [])

    pruned = walk(batch, per_sample, visit, rebuild=True)
    if not sizes:
        raise no_rows_error(batch)
    if len(set(sizes.values())) > 1:
        raise disagree_error(sizes)
    return cast(BatchT, pruned)


def strings_as_row_indices(batch: BatchT, *, per_sample: PerSample = None) -> BatchT:
    """``batch`` with every per-sample leaf that is a sequence of strings (``str``/``bytes``,
    what ``default_collate`` makes of a text field) replaced by its row indices, an int64
    ``arange(N)`` on the device of the batch's first tensor; other leaves are kept as they are.

    The compiled step applies it on the host before tracing (see :class:`sbfunc.step.TrainStep`):
    ``torch.compile`` guards on every string of a list it traces, so a text field would
    recompile the step on every batch, while an index tensor is pruned with the rows inside the
    graph like any other leaf. Strings cannot enter a compiled graph anyway, and code that reads
    them as strings fails loudly on a tensor. A batch without such a leaf is returned as is.

    Example:
        >>> from sbfunc.batch import strings_as_row_indices
        >>> strings_as_row_indices({"x": torch.zeros(3, 1), "text": ["a", "b", "c"], "s": "tr"})
        {'x': tensor([[0.], [0.], [0.]]), 'text': tensor([0, 1, 2]), 's': 'tr'}

    References:
        PyTorch ``default_collate`` (strings become a list per batch); the ``torch.compile``
        guards on Python constants.
    """
    if per_sample is None and flat_tensors(batch) >= 0:
        return batch
    found: list[bool] = []
    tensors = [x for x in optree.tree_leaves(cast(Any, batch)) if isinstance(x, torch.Tensor)]
    device = tensors[0].device if tensors else torch.device("cpu")

    def visit(path: tuple[Any, ...], leaf: Any, size: int | None) -> Any:
        if size is None or not _all_strings(leaf):
            return leaf
        found.append(True)
        return torch.arange(size, device=device)

    out = walk(batch, per_sample, visit, rebuild=True)
    return cast(BatchT, out) if found else batch


def _all_strings(leaf: Any) -> bool:
    return isinstance(leaf, list | tuple) and all(isinstance(v, str | bytes) for v in leaf)


def check_same_spec(per_sample: PerSample, algorithms: Iterable[Any]) -> None:
    """Check that every algorithm that prunes rows (one with a ``per_sample`` attribute, such as
    :class:`sbfunc.SelectiveBackprop`, found inside combinators through their ``parts``) uses
    the step's ``per_sample`` spec, so the step counts the rows the algorithm prunes.

    Raises:
        ValueError: naming the first algorithm whose spec differs, and both specs.

    Example:
        >>> scoring = sbfunc.score.Scoring(loss_fn=lambda p, b, x: x)
        >>> sb = sbfunc.SelectiveBackprop(per_sample={"w": False}, scoring=scoring)
        >>> sbfunc.batch.check_same_spec({"w": False}, [sbfunc.sequence(sb)])
        >>> sbfunc.batch.check_same_spec(None, [sb])
        Traceback (most recent call last):
        ...
        ValueError: SelectiveBackprop prunes with per_sample={'w': False}, but the step ...

    References:
        Equinox ``filter_spec`` (one spec for one batch).
    """
    pending = list(algorithms)
    while pending:
        alg = pending.pop(0)
        pending.extend(getattr(alg, "parts", ()))
        if not hasattr(alg, "per_sample"):
            continue
        theirs = alg.per_sample
        try:
            same = theirs is per_sample or bool(theirs == per_sample)
        except Exception:  # a spec whose == does not give a bool
            same = False
        if not same:
            raise ValueError(
                f"{getattr(alg, 'name', type(alg).__name__)} prunes with per_sample={theirs!r}, "
                f"but the step counts rows with per_sample={per_sample!r}; pass the same spec "
                "to make_train_step(..., per_sample=) and to the algorithm"
            )


def check_field(name: str, field: object) -> int | str:
    """``field`` if it is an int (tuple batch) or a str (dict batch), else a ``TypeError``
    naming the argument ``name``: the check of a :data:`Field` given to an algorithm.

    Example:
        >>> sbfunc.batch.check_field("target", "labels")
        'labels'
    """
    if isinstance(field, bool) or not isinstance(field, int | str):
        raise TypeError(
            f"{name} must be an int (tuple batch) or a str (dict batch), got {describe(field)}"
        )
    return field


def extract(batch: Any, key: Field, what: str = "key") -> Any:
    """Read one field of a batch: an ``int`` indexes a tuple/list, a ``str`` a mapping (or names
    a namedtuple field), and a callable is applied to the batch.

    Example:
        >>> sbfunc.batch.extract({"image": 1, "label": 2}, "label")
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


def replace(batch: BatchT, key: int | str, value: Any) -> BatchT:
    """A copy of ``batch`` with one top-level field replaced; the input is not modified.

    ``key`` is an int for tuples, lists and namedtuples (the type is kept), a str for
    mappings (a ``dict`` copy is returned for any mapping) or a field name of a namedtuple.

    Example:
        >>> sbfunc.batch.replace((1, 2), 1, 5), sbfunc.batch.replace({"x": 1}, "x", 0)
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


__getattr__ = moved_names("sbfunc.batch", ("1.1", ("sbfunc.types", ("ROWS",))))
__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
