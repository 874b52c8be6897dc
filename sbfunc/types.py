"""The types every part of sbfunc shares, each defined once.

* :data:`Params`: tensors by name (parameters, buffers, gradients, updates).
* :data:`Device`: where a function puts the tensors it makes.
* :data:`Batch`: any pytree whose per-sample leaves share a first axis.
* :class:`LossFn`: the spine type, ``(params, buffers, batch) -> Tensor[N]``.
* :class:`EmptyState`: the state of a transform that keeps none.
* :data:`PerSample`: which leaves of a batch are per-sample (with :data:`ROWS` and
  :data:`LeafFilter`); :mod:`sbfunc` applies it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, NamedTuple, Protocol, Union

import torch

from sbfunc._namespace import api_dir, moved_names

__all__ = [
    "ROWS",
    "Batch",
    "Device",
    "EmptyState",
    "LeafFilter",
    "LossFn",
    "Params",
    "PerSample",
    "Rows",
]

Params = dict[str, torch.Tensor]
"""Tensors by name: parameters, buffers, gradients and updates alike."""

Device = torch.device | str | None
"""Where a function puts the tensors it makes: a ``torch.device``, its name (``"cpu"``), or
``None`` for the function's default (its key's device for a sampler)."""

Batch = Any
"""A pytree (tensors, dicts, lists, tuples, namedtuples, strings) whose per-sample leaves share
their first axis."""


class LossFn(Protocol):
    """A pure per-sample loss function: ``(params, buffers, batch) -> Tensor[N]``."""

    def __call__(self, params: Params, buffers: Params, batch: Batch, /) -> torch.Tensor: ...


class EmptyState(NamedTuple):
    """The state of a transform that keeps none (optax's ``EmptyState``): the gradient
    transforms' and the selection policies' alike.

    Example:
        >>> from sbfunc.types import EmptyState
        >>> sbfunc.optim.scale(0.5).init({"w": torch.ones(2)})
        EmptyState()
    """


class Rows:
    """The type of :data:`ROWS`, the spec marker for "index this value as a whole by sample"."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ROWS"

    def __reduce__(self) -> str:
        return "ROWS"


ROWS: Final = Rows()
"""Spec marker: the value here has one entry per sample along its first axis and is indexed as
a whole: a list/tuple of ``N`` items of any kind (per-image target dicts, ragged tensors), a
tensor or an array. Use it where the default rule would see a node."""

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
"""Which leaves of a batch are per-sample: a pytree prefix of the batch (Equinox's
``filter_spec``) whose entries apply to the whole subtree below them.

* ``None``: infer with the default rule (:mod:`sbfunc`);
* ``True``: every leaf below is per-sample (a leaf without a leading axis is an error);
* ``False``: everything below is metadata and passes through untouched;
* :data:`ROWS`: the value here is one per-sample sequence/array, indexed as a whole;
* a callable ``(path, leaf) -> bool`` (:data:`LeafFilter`) decides for every leaf below;
* a ``dict`` (keys: a subset of the batch mapping's keys or namedtuple field names; missing keys
  are ``None``) or a ``list``/``tuple`` of the batch sequence's length, of the above.

Example: ``{"class_weight": False}`` declares a ``[C]`` tensor that happens to have ``C == N``
entries as metadata, ``{"targets": ROWS}`` a list of per-image dicts of tensors as per-sample.
"""


__getattr__ = moved_names("sbfunc.types", ("1.2", ("sbfunc.random", ("Key",))))
__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
