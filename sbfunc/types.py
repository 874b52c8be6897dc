"""The types every part of sbfunc shares, each defined once.

* :data:`Params`: tensors by name (parameters, buffers, gradients, updates).
* :data:`Key`: an :mod:`sbfunc.random` key.
* :data:`Batch`: any pytree whose per-sample leaves share a first axis.
* :class:`LossFn`: the spine type, ``(params, buffers, batch) -> Tensor[N]``.
* :class:`EmptyState`: the state of a transform that keeps none.

Which leaves of a batch are per-sample is :data:`sbfunc.batch.PerSample`.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import torch

__all__ = ["Batch", "EmptyState", "Key", "LossFn", "Params"]

Params = dict[str, torch.Tensor]
"""Tensors by name: parameters, buffers, gradients and updates alike."""

Key = torch.Tensor
"""An ``int64`` tensor of shape ``(2,)`` holding two 32-bit words; build one with
:func:`sbfunc.random.key`."""

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
