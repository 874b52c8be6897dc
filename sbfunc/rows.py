"""Which leaves of a batch are per-sample *rows*: the default rule and the ``per_sample`` spec.

A leaf is *per-sample* when it holds one entry per sample along its first axis:

* a tensor or NumPy array of rank >= 1 (its rows ``x[i]``);
* a *row sequence*: a plain ``list`` or ``tuple`` (not a namedtuple) that holds no tensor or
  array of rank >= 1 anywhere inside, such as the list of strings
  ``torch.utils.data.default_collate`` makes of a string field, a tuple of ids from
  ``zip(*samples)``, or a list of per-sample dicts of Python values. Its entries are its rows.

A ``list``/``tuple`` that holds a tensor or array of rank >= 1 is a pytree *node* (so an
``(x, y)`` batch is two leaves), as are mappings (``dict`` and its subclasses, ``UserDict``,
Hugging Face ``BatchEncoding``), namedtuples and optree-registered nodes. Everything else (0-d
tensors and arrays, scalars, strings, ``None``, other objects) is batch-wide metadata.

The rule is a default: every per-sample leaf must agree on the sample count ``N``, and when they
do not :func:`sbfunc.batch_size` raises instead of guessing. A ``per_sample`` *spec* (a pytree
prefix of the batch, as in Equinox's ``filter_spec``) says explicitly which leaves are rows; see
:data:`PerSample`.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any, Final, Union

import optree
import torch

from sbfunc._namespace import api_dir

__all__ = ["ROWS", "LeafFilter", "PerSample", "Rows", "check_per_sample", "path_str"]


class Rows:
    """The type of :data:`ROWS`, the spec marker for "index this value as a whole by sample"."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ROWS"

    def __reduce__(self) -> str:
        return "ROWS"


ROWS: Final = Rows()
"""Spec marker: the value at this position has one entry per sample along its first axis and is
indexed as a whole: a list/tuple of ``N`` items of any kind (a list of per-image target dicts of
tensors, ragged tensors), a tensor or an array. Use it where the default rule would see a node."""

LeafFilter = Callable[[tuple[Any, ...], Any], bool]
"""``(path, leaf) -> bool``: whether a leaf is per-sample; ``path`` is the tuple of keys from the
batch root (mapping keys, sequence indices, namedtuple field names)."""

PerSample = Union[  # noqa: UP007 (a recursive alias evaluated at runtime)
    None,
    bool,
    Rows,
    LeafFilter,
    Mapping[Any, "PerSample"],
    list["PerSample"],
    tuple["PerSample", ...],
]
"""Which leaves of a batch are per-sample: a pytree prefix of the batch whose entries apply to
the whole subtree below them.

* ``None``: infer with the default rule (module docstring);
* ``True``: every leaf below is per-sample (a leaf without a leading axis is an error);
* ``False``: everything below is metadata and passes through untouched;
* :data:`ROWS`: the value here is one per-sample sequence/array, indexed as a whole;
* a callable ``(path, leaf) -> bool`` (:data:`LeafFilter`) decides for every leaf below;
* a ``dict`` (keys: a subset of the batch mapping's keys or namedtuple field names; missing keys
  are ``None``) or a ``list``/``tuple`` of the batch sequence's length, of the above.

Example: ``{"class_weight": False}`` declares a ``[C]`` tensor that happens to have ``C == N``
entries as metadata, ``{"targets": ROWS}`` a list of per-image dicts of tensors as per-sample.
"""


class _Attr(str):
    """A path entry naming a namedtuple field (shown as ``.name``)."""

    __slots__ = ()


def path_str(path: tuple[Any, ...]) -> str:
    """Render a path of keys as ``batch['x'][0].field``.

    Example:
        >>> from sbfunc.rows import path_str
        >>> path_str(("inputs", 0))
        "batch['inputs'][0]"

    References:
        optree ``tree_flatten_with_path`` paths; JAX ``keystr``.
    """
    return "batch" + "".join(f".{p}" if isinstance(p, _Attr) else f"[{p!r}]" for p in path)


def ndarray_type() -> type | None:
    """``numpy.ndarray`` if NumPy is imported (no array can exist otherwise), else ``None``."""
    np = sys.modules.get("numpy")
    return None if np is None else np.ndarray


_SCALARS = (str, bytes, int, float, complex, bool, type(None))
_LEAVES = (*_SCALARS, torch.Tensor)


def _holds_array(x: Any, nd: type | None) -> bool:
    if isinstance(x, _SCALARS):
        return False
    if isinstance(x, torch.Tensor):
        return x.dim() > 0
    if nd is not None and isinstance(x, nd):
        return x.ndim > 0  # type: ignore[attr-defined]
    if isinstance(x, list | tuple):
        return any(_holds_array(v, nd) for v in x)
    if isinstance(x, Mapping):
        return any(_holds_array(v, nd) for v in x.values())
    if optree.tree_is_leaf(x):
        return False
    return any(_holds_array(v, nd) for v in optree.tree_flatten_one_level(x).children)


def is_row_sequence(x: Any) -> bool:
    """Whether ``x`` is a row sequence: a list/tuple, not a namedtuple, holding no tensor or
    array of rank >= 1 (see the module docstring).

    Example:
        >>> from sbfunc.rows import is_row_sequence
        >>> is_row_sequence(["a", "b"]), is_row_sequence((torch.zeros(2), torch.ones(2)))
        (True, False)

    References:
        PyTorch ``torch.utils.data.default_collate`` (strings become a list per batch).
    """
    return (
        isinstance(x, list | tuple)
        and not hasattr(x, "_fields")
        and not _holds_array(x, ndarray_type())
    )


def leading_size(x: Any) -> int | None:
    """The sample count of a per-sample leaf under the default rule, ``None`` for metadata.

    Example:
        >>> from sbfunc.rows import leading_size
        >>> leading_size(torch.zeros(3, 2)), leading_size(["a"]), leading_size(torch.tensor(1.0))
        (3, 1, None)

    References:
        MosaicML Composer ``DataSpec.get_num_samples_in_batch`` (dim 0 of the tensors).
    """
    if isinstance(x, torch.Tensor):
        return x.shape[0] if x.dim() else None
    nd = ndarray_type()
    if nd is not None and isinstance(x, nd):
        return x.shape[0] if x.ndim else None  # type: ignore[attr-defined]
    return len(x) if is_row_sequence(x) else None


def rows_size(path: tuple[Any, ...], x: Any) -> int:
    """The sample count of a value marked :data:`ROWS` (or ``True``): its length or dim 0.

    Raises:
        TypeError: if the value has no first axis (a mapping, a string, a scalar, a 0-d tensor).

    Example:
        >>> from sbfunc.rows import rows_size
        >>> rows_size(("t",), [{"boxes": torch.zeros(2, 4)}, {"boxes": torch.zeros(0, 4)}])
        2

    References:
        Equinox ``filter_spec`` (a prefix of booleans marking leaves).
    """
    size = leading_size(x)
    if size is None and isinstance(x, list | tuple) and not hasattr(x, "_fields"):
        size = len(x)
    if size is None:
        raise TypeError(
            f"per_sample marks {path_str(path)} as per-sample, but a {type(x).__name__} has no "
            "leading (sample) axis; per-sample values are tensors/arrays of rank >= 1 and "
            "lists/tuples with one entry per sample"
        )
    return size


_SPEC_HELP = (
    "must be None, True, False, sbfunc.batch.ROWS, a callable (path, leaf) -> bool, or a "
    "dict/list/tuple of those"
)


def check_per_sample(per_sample: PerSample, _path: tuple[Any, ...] = ()) -> PerSample:
    """Validate a ``per_sample`` spec on its own (before any batch is seen) and return it.

    Args:
        per_sample: a :data:`PerSample` spec.

    Returns:
        ``per_sample`` unchanged.

    Raises:
        TypeError: for an entry that is not a :data:`PerSample` form (the message names where).

    Example:
        >>> sbfunc.batch.check_per_sample({"x": True, "meta": (False, sbfunc.batch.ROWS)})
        {'x': True, 'meta': (False, ROWS)}
        >>> sbfunc.batch.check_per_sample({"x": 1})
        Traceback (most recent call last):
        ...
        TypeError: per_sample['x'] must be None, True, False, ... got 1 (int)

    References:
        Equinox ``filter_spec`` (a pytree prefix of bools or callables).
    """
    if per_sample is None or isinstance(per_sample, bool | Rows):
        return per_sample
    if isinstance(per_sample, Mapping):
        for k, v in per_sample.items():
            check_per_sample(v, (*_path, k))
        return per_sample
    if isinstance(per_sample, list | tuple):
        for i, v in enumerate(per_sample):
            check_per_sample(v, (*_path, i))
        return per_sample
    if callable(per_sample):
        return per_sample
    raise _spec_error(_path, per_sample)


def _spec_error(path: tuple[Any, ...], value: Any) -> TypeError:
    return TypeError(
        f"per_sample{path_str(path)[5:]} {_SPEC_HELP}; got {value!r} ({type(value).__name__})"
    )


Node = tuple[list[Any], list[Any], Callable[[list[Any]], Any]]
"""A pytree node one level deep: ``(keys, children, rebuild)``."""


def _rebuild_mapping(x: Mapping[Any, Any], items: dict[Any, Any]) -> Any:
    if type(x) is dict:
        return items
    if isinstance(x, defaultdict):
        return defaultdict(x.default_factory, items)
    try:
        return type(x)(items)  # type: ignore[call-arg]  # OrderedDict, UserDict, ModelOutput...
    except TypeError:  # a mapping type that cannot be built from a dict
        return items


def rebuild_sequence(x: list[Any] | tuple[Any, ...], items: list[Any]) -> Any:
    """A list/tuple of ``items`` of ``x``'s type when it can be built from a list, else its
    base type (``list`` or ``tuple``); namedtuples are built field by field."""
    if hasattr(x, "_fields"):
        return type(x)(*items)
    if type(x) in (list, tuple):
        return type(x)(items)
    try:
        return type(x)(items)
    except TypeError:
        return list(items) if isinstance(x, list) else tuple(items)


def node(x: Any, *, force: bool = False) -> Node | None:
    """``(keys, children, rebuild)`` of a pytree node, ``None`` for a leaf under the default rule
    (a row sequence is a leaf unless ``force``).

    Example:
        >>> from sbfunc.rows import node
        >>> keys, children, rebuild = node({"a": 1, "b": 2})
        >>> keys, rebuild([3, 4]), node(["s", "t"])
        (['a', 'b'], {'a': 3, 'b': 4}, None)

    References:
        optree ``tree_flatten_one_level``.
    """
    if isinstance(x, _LEAVES):
        return None
    if isinstance(x, Mapping):
        keys = list(x.keys())
        return (
            keys,
            [x[k] for k in keys],
            lambda new: _rebuild_mapping(x, dict(zip(keys, new, strict=True))),
        )
    if isinstance(x, list | tuple):
        if hasattr(x, "_fields"):
            return [_Attr(f) for f in x._fields], list(x), lambda new: type(x)(*new)
        if not force and not _holds_array(x, ndarray_type()):
            return None
        return list(range(len(x))), list(x), lambda new: rebuild_sequence(x, new)
    if optree.tree_is_leaf(x):
        return None
    out = optree.tree_flatten_one_level(x)
    return list(out.entries), list(out.children), lambda new: out.unflatten_func(out.metadata, new)


Visit = Callable[[tuple[Any, ...], Any, int | None], Any]
"""``visit(path, leaf, size)``: called on every leaf; ``size`` is ``None`` for metadata."""


def _leaf_size(path: tuple[Any, ...], x: Any, spec: Any) -> int | None:
    if spec is None:
        return leading_size(x)
    if spec is True:
        return rows_size(path, x)
    keep = spec(path, x)
    if not isinstance(keep, bool):
        raise TypeError(
            f"the per_sample callable must return a bool, got {keep!r} for {path_str(path)}"
        )
    return rows_size(path, x) if keep else None


def walk(
    x: Any, spec: PerSample, visit: Visit, *, rebuild: bool, path: tuple[Any, ...] = ()
) -> Any:
    """Call ``visit`` on every leaf of the batch ``x`` with its sample count under ``spec``.

    Subtrees marked ``False`` are skipped and returned as they are (the same object).

    Args:
        x: the batch (or a subtree of it).
        spec: a :data:`PerSample` spec (a prefix of ``x``).
        visit: ``visit(path, leaf, size) -> new_leaf``.
        rebuild: build and return a new tree of the visited leaves (else return ``x``).
        path: the path of ``x`` from the batch root.

    Returns:
        The rebuilt tree (containers keep their types where they can) or ``x``.

    Raises:
        TypeError: for a malformed spec, a spec container where the batch has a leaf or another
            kind of container, a per-sample mark on a value with no first axis, or a callable
            spec that does not return a bool.
        ValueError: for spec keys missing from the batch or a spec sequence of another length.

    Example:
        >>> from sbfunc.rows import walk
        >>> seen = []
        >>> _ = walk({"x": torch.zeros(2), "w": torch.ones(2), "s": ["a", "b"]}, {"w": False},
        ...          lambda path, leaf, n: seen.append((path, n)), rebuild=False)
        >>> seen
        [(('x',), 2), (('s',), 2)]

    References:
        Equinox ``filter_spec`` prefixes; optree ``tree_map_with_path``.
    """
    if spec is False:
        return x
    if isinstance(spec, Rows):
        return visit(path, x, rows_size(path, x))
    if spec is None or spec is True or callable(spec):
        parts = node(x)
        if parts is None:
            return visit(path, x, _leaf_size(path, x, spec))
        specs: list[Any] = [spec] * len(parts[0])
    else:
        if not isinstance(spec, Mapping | list | tuple):
            raise _spec_error(path, spec)
        parts = _match(x, spec, path)
        specs = [spec.get(k) for k in parts[0]] if isinstance(spec, Mapping) else list(spec)
    keys, children, build = parts
    new = [
        walk(c, s, visit, rebuild=rebuild, path=(*path, k))
        for k, c, s in zip(keys, children, specs, strict=True)
    ]
    return build(new) if rebuild else x


def _match(x: Any, spec: Any, path: tuple[Any, ...]) -> Node:
    parts = node(x, force=True)
    kind = "a dict" if isinstance(spec, Mapping) else f"a {type(spec).__name__} of {len(spec)}"
    if parts is None or not (
        isinstance(x, Mapping | list | tuple)
        and (isinstance(spec, Mapping) or not isinstance(x, Mapping))
    ):
        raise TypeError(
            f"per_sample{path_str(path)[5:]} is {kind}, but {path_str(path)} is a "
            f"{type(x).__name__}; give a bool, ROWS or a callable there instead"
        )
    if isinstance(spec, Mapping):
        unknown = [k for k in spec if k not in parts[0]]
        if unknown:
            raise ValueError(
                f"per_sample{path_str(path)[5:]} names {unknown}, which {path_str(path)} does "
                f"not have; its keys are {[str(k) for k in parts[0]]}"
            )
    elif len(spec) != len(parts[0]):
        raise ValueError(
            f"per_sample{path_str(path)[5:]} is {kind} entries, but {path_str(path)} has "
            f"{len(parts[0])}"
        )
    return parts


__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
