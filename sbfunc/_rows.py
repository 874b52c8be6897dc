"""Which leaves of a batch are per-sample *rows*, and how many rows it has (:func:`batch_size`):
the default rule and the ``per_sample`` spec.

By default a leaf is per-sample when it holds one entry per sample along its first axis: a
tensor or NumPy array of rank >= 1, or a *row sequence*, a plain ``list``/``tuple`` (not a
namedtuple) holding no tensor or array of rank >= 1 anywhere inside (the list of strings
``default_collate`` makes of a text field, a tuple of ids, a list of per-sample dicts of Python
values). A list/tuple holding such a tensor is a pytree node (``(x, y)`` is two leaves), as are
mappings (``dict``, ``UserDict``, ``BatchEncoding``...), namedtuples and optree nodes; anything
else (0-d tensors, scalars, strings, ``None``) is batch-wide metadata. Per-sample leaves must
agree on ``N``; a ``per_sample`` spec (:data:`sbfunc.types.PerSample`) says which leaves are
rows where the default guesses wrong.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Mapping
from typing import Any, Final, cast

import optree
import torch

from sbfunc.types import ROWS, LeafFilter, PerSample, Rows

__all__ = [
    "ROWS",
    "LeafFilter",
    "PerSample",
    "Rows",
    "batch_size",
    "check_per_sample",
    "disagree_error",
    "flat_tensors",
    "no_rows_error",
    "path_str",
    "per_sample_sizes",
]


NAMESPACE: Final = "sbfunc.batch"
"""sbfunc's optree namespace: dicts keep insertion order, and the mapping and list/tuple types
optree does not know (``UserDict``, ``BatchEncoding``...) become nodes in it when first seen."""
_ORDERED = optree.dict_insertion_ordered(True, namespace=NAMESPACE)
_ORDERED.__enter__()  # for good: the namespace is sbfunc's own
_KNOWN: set[type] = set()
Visit = Callable[[tuple[Any, ...], Any, int | None], Any]
"""``visit(path, leaf, size)``: called on every leaf; ``size`` is ``None`` for metadata."""


class _Attr(str):
    """A path entry naming a namedtuple field (shown as ``.name``)."""

    __slots__ = ()


def path_str(path: tuple[Any, ...]) -> str:
    """Render a path of keys: ``path_str(("inputs", 0)) == "batch['inputs'][0]"``."""
    return "batch" + "".join(f".{p}" if isinstance(p, _Attr) else f"[{p!r}]" for p in path)


def ndarray_type() -> type | None:
    """``numpy.ndarray`` if NumPy is imported (no array can exist otherwise), else ``None``."""
    np = sys.modules.get("numpy")
    return None if np is None else np.ndarray


def rebuild_sequence(x: list[Any] | tuple[Any, ...], items: list[Any]) -> Any:
    """A list/tuple of ``items`` of ``x``'s type (its base type when that cannot be built from a
    list); namedtuples are built field by field."""
    return type(x)(*items) if hasattr(x, "_fields") else _sequence(type(x), None, items)


def _sequence(cls: type, _: None, items: list[Any]) -> Any:
    try:
        return cls(items)
    except TypeError:
        return list(items) if issubclass(cls, list) else tuple(items)


def _mapping(cls: type, keys: tuple[Any, ...], children: list[Any]) -> Any:
    items = dict(zip(keys, children, strict=True))
    try:  # UserDict, MappingProxyType, BatchEncoding...; a plain dict if cls(dict) fails
        return cls(items)
    except TypeError:
        return items


def _flat_mapping(m: Mapping[Any, Any]) -> tuple[list[Any], tuple[Any, ...], tuple[Any, ...]]:
    return [m[k] for k in m], tuple(m), tuple(m)


def assume_constant_result(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.compiler.assume_constant_result(fn)`` without importing ``torch._dynamo`` (which
    that function imports, doubling ``import sbfunc``'s time): the compiler runs a marked
    function at trace time, outside the graph, and uses its result as a constant. The marker is
    the one attribute torch's decorator sets (``tests/test_rows.py`` checks that it still is)."""
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return fn


@assume_constant_result  # runs at trace time, outside the graph
def register(cls: type) -> bool:
    """Make a mapping or list/tuple type optree does not know a node of :data:`NAMESPACE`, once
    (the ``is_leaf`` hooks call it before optree looks a type up). Returns ``False``."""
    if cls in _KNOWN:
        return False
    known = optree.register_pytree_node.get(cls, namespace=NAMESPACE)
    if known is None and issubclass(cls, Mapping | list | tuple):
        mapping = issubclass(cls, Mapping)
        flat: Any = _flat_mapping if mapping else lambda s: (list(s), None)
        unflat = functools.partial(_mapping if mapping else _sequence, cls)
        with contextlib.suppress(ValueError):  # registered meanwhile by another thread
            optree.register_pytree_node(cls, flat, unflat, namespace=NAMESPACE)
    _KNOWN.add(cls)
    return False


def _node(x: Any) -> bool:
    return register(type(x))


def _array_types() -> tuple[type[Any], ...]:
    return (torch.Tensor, ndarray_type() or torch.Tensor)


def is_row_sequence(x: Any) -> bool:
    """Whether ``x`` is a row sequence (module docstring): ``["a", "b"]`` is one;
    ``(torch.zeros(2), "m")`` (it holds an array) and namedtuples are not."""
    if not isinstance(x, list | tuple) or hasattr(x, "_fields"):
        return False
    arrays = _array_types()
    leaves = optree.tree_iter(cast(Any, x), _node, none_is_leaf=True, namespace=NAMESPACE)
    return not any(isinstance(v, arrays) and v.ndim > 0 for v in leaves)


def _is_leaf(x: Any) -> bool:
    return register(type(x)) or is_row_sequence(x)


def leading_size(x: Any) -> int | None:
    """The sample count of a leaf under the default rule (dim 0, a row sequence's length);
    ``None`` for metadata (a 0-d tensor, a string, a scalar)."""
    if isinstance(x, _array_types()):
        return x.shape[0] if x.ndim else None
    return len(x) if is_row_sequence(x) else None


def rows_size(path: tuple[Any, ...], x: Any) -> int:
    """The sample count of a value marked :data:`ROWS` or ``True``: dim 0 or a list/tuple's
    length; a ``TypeError`` naming ``path`` for a value with no first axis."""
    plain = isinstance(x, list | tuple) and not hasattr(x, "_fields")
    size = len(x) if plain else leading_size(x)
    if size is None:
        raise TypeError(
            f"per_sample marks {path_str(path)} as per-sample, but a {type(x).__name__} has no "
            "leading (sample) axis; per-sample values are tensors/arrays of rank >= 1 and "
            "lists/tuples with one entry per sample"
        )
    return size


def check_per_sample(per_sample: PerSample) -> PerSample:
    """Validate a ``per_sample`` spec on its own (before any batch is seen) and return it.

    Raises:
        TypeError: for an entry that is not a :data:`PerSample` form (the message names where).

    Example:
        >>> check_per_sample({"x": True, "meta": (False, ROWS)})
        {'x': True, 'meta': (False, ROWS)}
        >>> check_per_sample({"x": 1})
        Traceback (most recent call last):
        ...
        TypeError: per_sample['x'] must be None, True, False, ... got 1 (int)
    """
    paths, leaves, _ = optree.tree_flatten_with_path(
        cast(Any, per_sample), _spec_leaf, none_is_leaf=True, namespace=NAMESPACE
    )
    for path, s in zip(paths, leaves, strict=True):
        if not (s is None or isinstance(s, bool | Rows) or callable(s)):
            raise _spec_error(path, s)
    return per_sample


def _spec_error(path: tuple[Any, ...], value: Any) -> TypeError:
    return TypeError(
        f"per_sample{path_str(path)[5:]} must be None, True, False, sbfunc.types.ROWS, a "
        "callable (path, leaf) -> bool, or a dict/list/tuple of those; got "
        f"{value!r} ({type(value).__name__})"
    )


def _spec_leaf(s: Any) -> bool:
    return register(type(s)) or not isinstance(s, Mapping | list | tuple)


def walk(
    x: Any, spec: PerSample, visit: Visit, *, rebuild: bool, path: tuple[Any, ...] = ()
) -> Any:
    """Call ``visit(path, leaf, size)`` on every leaf of the batch ``x`` (``size``: its sample
    count under ``spec``, ``None`` for metadata); return the tree of the results if ``rebuild``
    (containers keep their types where they can), else ``x``.

    The spec's containers are matched to ``x`` level by level; below them the leaves are those
    of ``optree.tree_flatten`` with the default rule as ``is_leaf``. Subtrees marked ``False``
    are not visited and come back as the same objects.

    Raises:
        TypeError: for a malformed spec, a spec container where the batch has another kind of
            value, a per-sample mark on a value with no first axis, or a callable spec that
            does not return a bool.
        ValueError: for spec keys missing from the batch or a spec sequence of another length.

    Example:
        >>> batch = {"x": torch.zeros(2), "w": torch.ones(2), "s": ["a", "b"]}
        >>> walk(batch, {"w": False}, lambda path, leaf, n: (path, n), rebuild=True)
        {'x': (('x',), 2), 'w': tensor([1., 1.]), 's': (('s',), 2)}
    """
    if spec is False:
        return x
    if isinstance(spec, Rows):
        return visit(path, x, rows_size(path, x))
    if isinstance(spec, Mapping | list | tuple):
        return _walk_spec(x, spec, visit, rebuild, path)
    if not (spec is None or spec is True or callable(spec)):
        raise _spec_error(path, spec)
    leaves, treespec = optree.tree_flatten(x, _is_leaf, none_is_leaf=True, namespace=NAMESPACE)
    tails = (_paths.__wrapped__ if torch.compiler.is_compiling() else _paths)(treespec)
    paths = [(*path, *q) for q in tails] if path else tails
    new = [visit(p, v, _leaf_size(p, v, spec)) for p, v in zip(paths, leaves, strict=True)]
    return treespec.unflatten(new) if rebuild else x


@functools.lru_cache(maxsize=256)
def _paths(treespec: optree.PyTreeSpec) -> list[tuple[Any, ...]]:
    """The key path of every leaf (namedtuple fields as ``_Attr``), cached by structure."""
    return [
        tuple(_Attr(e.field) if isinstance(e, optree.NamedTupleEntry) else e.entry for e in a)
        for a in treespec.accessors()
    ]


def _leaf_size(path: tuple[Any, ...], x: Any, spec: Any) -> int | None:
    if spec is None:
        return leading_size(x)
    keep = True if spec is True else spec(path, x)
    if not isinstance(keep, bool):
        raise TypeError(
            f"the per_sample callable must return a bool, got {keep!r} for {path_str(path)}"
        )
    return rows_size(path, x) if keep else None


def _walk_spec(x: Any, spec: Any, visit: Visit, rebuild: bool, path: tuple[Any, ...]) -> Any:
    """:func:`walk` one level down where ``spec`` is a dict/list/tuple matching ``x``."""
    named, at = isinstance(spec, Mapping), f"per_sample{path_str(path)[5:]}"
    kind = "a dict" if named else f"a {type(spec).__name__} of {len(spec)}"
    if not isinstance(x, Mapping | list | tuple) or (isinstance(x, Mapping) and not named):
        raise TypeError(
            f"{at} is {kind}, but {path_str(path)} is a {type(x).__name__}; give a bool, ROWS "
            "or a callable there instead"
        )
    register(type(x))
    one: Any = optree.tree_flatten_one_level(cast(Any, x), none_is_leaf=True, namespace=NAMESPACE)
    fields = getattr(x, "_fields", None)
    keys = [_Attr(f) for f in fields] if fields is not None else list(one.entries)
    if named and any(k not in keys for k in spec):
        raise ValueError(
            f"{at} names {[k for k in spec if k not in keys]}, which {path_str(path)} does not "
            f"have; its keys are {[str(k) for k in keys]}"
        )
    if not named and len(spec) != len(keys):
        raise ValueError(f"{at} is {kind} entries, but {path_str(path)} has {len(keys)}")
    new = [
        walk(c, spec.get(k) if named else s, visit, rebuild=rebuild, path=(*path, k))
        for k, c, s in zip(keys, one.children, keys if named else spec, strict=True)
    ]
    return one.unflatten_func(one.metadata, new) if rebuild else x


def flat_tensors(batch: Any) -> int:
    """The hot path: ``N`` when ``batch`` is a tuple/list/dict of plain tensors of rank >= 1
    that share dim 0 (always per-sample under the default rule), else -1."""
    kind = type(batch)
    values = batch.values() if kind is dict else batch if kind in (tuple, list) else None
    n = -1
    for t in values or ():
        if type(t) is not torch.Tensor or t.dim() == 0 or (n >= 0 and t.shape[0] != n):
            return -1
        n = t.shape[0]
    return n


def per_sample_sizes(batch: Any, per_sample: PerSample = None) -> dict[str, int]:
    """``{path: N}`` for every per-sample leaf of ``batch`` (see :data:`PerSample`).

    Example:
        >>> from sbfunc.batch import per_sample_sizes
        >>> per_sample_sizes({"x": torch.zeros(3, 2), "t": ["a", "b", "c"], "tag": "train"})
        {"batch['x']": 3, "batch['t']": 3}

    References:
        optree ``tree_flatten_with_path``; Equinox ``filter_spec``.
    """
    sizes: dict[str, int] = {}
    walk(
        batch,
        per_sample,
        lambda p, _, n: n is None or sizes.update({path_str(p): n}),
        rebuild=False,
    )
    return sizes


def no_rows_error(batch: Any) -> ValueError:
    """The error of a batch without a per-sample leaf."""
    return ValueError(
        "batch has no per-sample leaf (a tensor or array of rank >= 1, or a list/tuple of "
        f"per-sample values); got a {type(batch).__name__}. Mark the per-sample leaves with "
        "per_sample= (see sbfunc.types.PerSample)"
    )


def disagree_error(sizes: dict[str, int]) -> ValueError:
    """The error of per-sample leaves (``{path: rows}``) that disagree on their rows."""
    detail = ", ".join(f"{name}: {n}" for name, n in sizes.items())
    return ValueError(
        f"batch leaves disagree on the leading (sample) dimension: {detail}. Every per-sample "
        "leaf must have the same size N along its first axis; pass per_sample= to say which "
        "leaves are per-sample, e.g. per_sample={'class_weight': False} for metadata that only "
        "looks per-sample, or per_sample={'targets': sbfunc.types.ROWS} for a list with one "
        "entry (of any kind) per sample (see sbfunc.types.PerSample)"
    )


def batch_size(batch: Any, *, per_sample: PerSample = None) -> int:
    """Number of samples in a pytree batch: the shared leading size of its per-sample leaves.

    Args:
        batch: a tensor or any pytree of tensors, arrays, row sequences and metadata.
        per_sample: which leaves are per-sample (:data:`PerSample`); ``None`` infers them.

    Returns:
        The leading size ``N`` shared by every per-sample leaf (a Python int read from shapes
        and lengths, so no device sync).

    Raises:
        ValueError: if the batch has no per-sample leaf, or its per-sample leaves disagree on
            the leading dimension (the message names every leaf with its size and says how to
            pass ``per_sample=``).
        TypeError: for a malformed ``per_sample`` spec.

    Example:
        >>> batch = {"x": torch.zeros(4, 3), "y": torch.zeros(4), "text": ["a", "b", "c", "d"]}
        >>> sbfunc.batch.batch_size(batch)
        4
        >>> sbfunc.batch.batch_size({**batch, "w": torch.ones(3)})
        Traceback (most recent call last):
        ...
        ValueError: batch leaves disagree on the leading (sample) dimension: batch['x']: 4, ...
        >>> sbfunc.batch.batch_size({**batch, "w": torch.ones(3)}, per_sample={"w": False})
        4

    References:
        MosaicML Composer ``DataSpec.get_num_samples_in_batch`` (its default reads dim 0 of the
        batch's tensors); Equinox ``filter_spec``.
    """
    if per_sample is None:
        if type(batch) is torch.Tensor and batch.dim():
            return batch.shape[0]
        n = flat_tensors(batch)
        if n >= 0:
            return n
    sizes = per_sample_sizes(batch, per_sample)
    if not sizes:
        raise no_rows_error(batch)
    first = next(iter(sizes.values()))
    if any(n != first for n in sizes.values()):
        raise disagree_error(sizes)
    return first
