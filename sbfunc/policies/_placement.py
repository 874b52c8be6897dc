"""Where a policy's state lives: on the device of the tensors it is used with.

A policy's ``init()`` takes no arguments, so a per-id table starts on the device it was built
for (the CPU by default) while the scores and ids of a step live on the accelerator. Reading
the table there would copy it to the host on every step (a sync); instead the state follows
the step's tensors: :func:`follow` moves it once, on its first use, and it stays there
(``Tensor.to`` is a no-op for a tensor already on the device).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.utils._pytree as torch_pytree

from sbfunc.types import EmptyState

__all__ = ["follow", "following"]

S = TypeVar("S")
F = TypeVar("F", bound=Callable[..., Any])


def follow(state: S, like: torch.Tensor | None) -> S:
    """``state`` with every tensor on ``like``'s device (``state`` itself when ``like`` is
    ``None``). Uses torch's own pytree, which the compiler traces without a graph break.

    Example:
        >>> follow((torch.zeros(2), 3), torch.empty(1, device="meta"))[0].device
        device(type='meta')
    """
    if like is None or type(state) is EmptyState:  # nothing to move (a stateless policy)
        return state
    device = like.device

    def move(x: Any) -> Any:
        return x.to(device) if isinstance(x, torch.Tensor) else x

    return torch_pytree.tree_map(move, state)


def following(fn: F | None, data: int) -> F | None:
    """``fn(state, *args)`` with ``state`` moved to the device of ``args[data - 1]`` first
    (``None`` stays ``None``): a policy's ``score_rows`` and ``record``.

    Example:
        >>> where = following(lambda state, ids: state.device, 1)
        >>> where(torch.zeros(2), torch.empty(1, device="meta"))
        device(type='meta')
    """
    if fn is None:
        return None
    call = fn

    def on_device(state: Any, *args: Any) -> Any:
        return call(follow(state, args[data - 1]), *args)

    return on_device  # type: ignore[return-value]
