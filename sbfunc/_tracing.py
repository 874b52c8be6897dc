"""Whether code is being traced, and whether a tensor can be read on the host for free.

The eager fast paths of sbfunc branch on host values (a flag, a key's words) where reading
them costs nothing, and compute every case with tensor ops otherwise: under ``torch.compile``,
a ``torch.func`` transform or a jit trace, and for a tensor on an accelerator (reading it would
sync). :func:`replace_by_constructor` gives a ``NamedTuple`` a ``_replace`` whose copy every
torch's compiler rebuilds whole (torch 2.11's did not).
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch

__all__ = ["host_flag", "host_readable", "replace_by_constructor", "tracing"]

_T = TypeVar("_T", bound=type)


def tracing() -> bool:
    """Whether a compiler or a ``torch.func`` transform is tracing the current code."""
    return (
        torch.compiler.is_compiling() or torch._C._functorch.peek_interpreter_stack() is not None
    )


def host_readable(t: torch.Tensor) -> bool:
    """Whether the values of ``t`` may be read as Python numbers right now at no cost.

    True in plain eager code only: not while torch.compile (or export) traces, not under a
    torch.func transform (``t`` may be a wrapped tensor) nor a jit trace, never for a tensor
    subclass (fake, functional, ...) or a tensor on an accelerator (reading it would sync).
    """
    return (
        type(t) is torch.Tensor
        and t.is_cpu  # (cheaper than t.device.type: it makes no device object)
        and not torch.compiler.is_compiling()
        and not torch._C._is_tracing()  # torch.jit.is_tracing() outside TorchScript
        and torch._C._functorch.peek_interpreter_stack() is None
    )


def host_flag(flag: torch.Tensor) -> bool | None:
    """``flag`` as a Python bool when :func:`host_readable`, else ``None`` (select with
    ``torch.where`` instead of branching)."""
    return bool(flag) if host_readable(flag) else None


def replace_by_constructor(cls: _T) -> _T:
    """Give the ``NamedTuple`` class ``cls`` a ``_replace`` that builds the copy with ``cls(...)``.

    The standard ``_replace`` builds it with ``tuple.__new__(cls, map(...))``; torch 2.11's
    dynamo consumes that ``map`` while tracing and then rebuilds the copy from it, empty,
    wherever the copy leaves the graph (a compiled frame's return value, or a value live at
    a graph break). The constructor's copy is rebuilt from its fields on every torch. Same
    values and the same ``ValueError`` for an unknown field as the standard ``_replace``.

    Example:
        >>> from typing import NamedTuple
        >>> @replace_by_constructor
        ... class Pair(NamedTuple):
        ...     a: int
        ...     b: int
        >>> Pair(1, 2)._replace(b=3)
        Pair(a=1, b=3)

    References:
        Python's ``collections.namedtuple`` (``_replace``, ``_make``).
    """
    fields: tuple[str, ...] = cls._fields  # type: ignore[attr-defined]

    def _replace(self: Any, /, **changes: Any) -> Any:
        copy = type(self)(*map(changes.pop, fields, self))
        if changes:
            raise ValueError(f"Got unexpected field names: {list(changes)!r}")
        return copy

    cls._replace = _replace  # type: ignore[attr-defined]
    return cls
