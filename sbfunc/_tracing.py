"""Whether code is being traced, and whether a tensor can be read on the host for free.

The eager fast paths of sbfunc branch on host values (a flag, a key's words) where reading
them costs nothing, and compute every case with tensor ops otherwise: under ``torch.compile``,
a ``torch.func`` transform or a jit trace, and for a tensor on an accelerator (reading it would
sync).
"""

from __future__ import annotations

import torch

__all__ = ["host_flag", "host_readable", "tracing"]


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
