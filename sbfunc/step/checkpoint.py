"""Checkpoints of any pytree state that load with ``torch.load(weights_only=True)``.

``torch.load(..., weights_only=True)`` refuses arbitrary classes (NamedTuple states of sbfunc,
torchopt and user algorithms). A checkpoint therefore stores only the flat list of leaves
(tensors, ints, floats, strings, bools) and a printable record of the tree structure; loading
rebuilds the tree from a *template* of the same structure (for example a freshly initialised
state), and refuses a checkpoint whose structure differs.
"""

from __future__ import annotations

import os
from typing import Any, BinaryIO, TypeVar

import optree
import torch

__all__ = ["from_state_dict", "load", "save", "to_state_dict"]

T = TypeVar("T")
_FORMAT = "sbfunc.checkpoint/1"


def to_state_dict(tree: Any) -> dict[str, Any]:
    """Flatten a pytree into a ``weights_only``-safe dict: its leaves and its structure.

    Example:
        >>> d = sbfunc.checkpoint.to_state_dict({"w": torch.ones(2), "step": 3})
        >>> d["leaves"], d["format"]
        ([3, tensor([1., 1.])], 'sbfunc.checkpoint/1')

    References:
        optree ``tree_flatten(none_is_leaf=True)``; Flax ``flax.serialization.to_state_dict``;
        PyTorch ``torch.load(weights_only=True)``.
    """
    leaves, spec = optree.tree_flatten(tree, none_is_leaf=True)
    return {"format": _FORMAT, "structure": str(spec), "leaves": leaves}


def from_state_dict(d: dict[str, Any], like: T) -> T:
    """Rebuild a pytree from :func:`to_state_dict` output, with ``like``'s structure.

    Raises:
        ValueError: if ``d`` is not an sbfunc checkpoint or its structure differs from ``like``
            (the message shows both structures).

    Example:
        >>> d = sbfunc.checkpoint.to_state_dict({"w": torch.ones(2), "step": 3})
        >>> sbfunc.checkpoint.from_state_dict(d, {"w": torch.zeros(2), "step": 0})
        {'w': tensor([1., 1.]), 'step': 3}

    References:
        optree ``tree_unflatten``; Flax ``flax.serialization.from_state_dict(target, state)``
        (the template comes first there).
    """
    if not isinstance(d, dict) or d.get("format") != _FORMAT:
        raise ValueError(f"not an sbfunc checkpoint (expected format {_FORMAT!r})")
    _, spec = optree.tree_flatten(like, none_is_leaf=True)  # type: ignore[arg-type]
    if str(spec) != d["structure"]:
        raise ValueError(
            "checkpoint structure does not match the template `like`:\n"
            f"  checkpoint: {d['structure']}\n  template:   {spec}"
        )
    return optree.tree_unflatten(spec, d["leaves"])  # type: ignore[return-value]


def save(tree: Any, f: str | os.PathLike[str] | BinaryIO) -> None:
    """Save a pytree (a train state) with ``torch.save`` in a ``weights_only``-loadable form.

    Example:
        >>> import io
        >>> buf = io.BytesIO()
        >>> sbfunc.checkpoint.save({"w": torch.ones(2)}, buf)
        >>> _ = buf.seek(0)
        >>> sbfunc.checkpoint.load(buf, like={"w": torch.zeros(2)})
        {'w': tensor([1., 1.])}

    References:
        PyTorch ``torch.save`` and ``torch.load(weights_only=True)``.
    """
    torch.save(to_state_dict(tree), f)


def load(
    f: str | os.PathLike[str] | BinaryIO,
    like: T,
    *,
    map_location: str | torch.device | None = None,
) -> T:
    """Load a pytree saved by :func:`save`, with ``torch.load(weights_only=True)``.

    Args:
        f: a path or binary file.
        like: a template with the same structure (e.g. a freshly initialised state); its leaf
            values are ignored.
        map_location: passed to ``torch.load``.

    Example:
        >>> import io
        >>> buf = io.BytesIO()
        >>> sbfunc.checkpoint.save({"step": 7, "w": torch.ones(2)}, buf)
        >>> _ = buf.seek(0)
        >>> sbfunc.checkpoint.load(buf, like={"step": 0, "w": torch.zeros(2)})
        {'step': 7, 'w': tensor([1., 1.])}
        >>> _ = buf.seek(0)
        >>> sbfunc.checkpoint.load(buf, like={"w": torch.zeros(2)})
        Traceback (most recent call last):
        ...
        ValueError: checkpoint structure does not match the template `like`:...

    References:
        PyTorch ``torch.load(weights_only=True)``; Flax
        ``flax.serialization.from_bytes(target, ...)`` (restores into a template).
    """
    d = torch.load(f, map_location=map_location, weights_only=True)
    return from_state_dict(d, like)
