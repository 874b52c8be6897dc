"""The step's non-finite guard, both halves: corrupt rows masked before the forward
(:mod:`sbfunc.step.nonfinite`) and counted with the rows a selection left out for a
non-finite score, and an update whose loss or gradient is not finite kept from
the parameters, the optimizer state and the buffers (as optax ``apply_if_finite``, without a
host sync: one ``torch.where`` per tensor on a device or under the compiler; eagerly on the
CPU the flag is a host value already, and a branch skips the selects)."""

from __future__ import annotations

from typing import Any

import torch

from sbfunc.optim._finite import host_flag
from sbfunc.rows import PerSample
from sbfunc.step.gradients import keep_if_finite
from sbfunc.step.nonfinite import finite_rows, zero_rows
from sbfunc.step.records import Out
from sbfunc.step.replicas import Replicas

__all__ = ["count_unscorable", "keep_finite", "mask_corrupt_rows", "raise_if_nonfinite"]


def mask_corrupt_rows(batch: Any, *, per_sample: PerSample) -> tuple[Any, torch.Tensor | None]:
    """``(batch, ok)``: the batch with its non-finite rows zeroed and the ``Tensor[N]`` mask
    of finite rows; ``(batch, None)`` when every row is known to be finite (eagerly on the
    CPU, where reading the flag costs no sync) or the batch has no floating-point rows.

    Example:
        >>> from sbfunc.step.guard import mask_corrupt_rows
        >>> mask_corrupt_rows((torch.tensor([[1.0], [float("nan")]]),), per_sample=None)
        ((tensor([[1.], [0.]]),), tensor([ True, False]))
    """
    ok = finite_rows(batch, per_sample=per_sample)
    if ok is None or host_flag(ok.all()):
        return batch, None
    return zero_rows(batch, ok, per_sample=per_sample), ok


def keep_finite(
    finite: torch.Tensor | None, new: Any, old: Any, *, device: torch.device
) -> tuple[torch.Tensor, Any]:
    """``(finite, new)`` when ``finite`` holds (or is ``None``: no check), else
    ``(finite, old)``, over matching pytrees (the parameters, optimizer state and buffers
    after and before the update); a ``None`` flag comes back as ``True`` on ``device``.

    Example:
        >>> from sbfunc.step.guard import keep_finite
        >>> keep_finite(torch.tensor(False), {"w": torch.ones(1)}, {"w": torch.zeros(1)},
        ...             device=torch.device("cpu"))
        (tensor(False), {'w': tensor([0.])})
    """
    if finite is None:
        return torch.ones((), dtype=torch.bool, device=device), new
    host = host_flag(finite)
    if host is not None:  # eagerly on the CPU: branch instead of a torch.where per tensor
        return finite, new if host else old
    return finite, keep_if_finite(finite, new, old)


def count_unscorable(out: Out, unscorable: torch.Tensor | None) -> Out:
    """``out`` with the rows a selection left out for a non-finite score
    (``State.rows_unscorable``) added to ``out.rows_nonfinite``, so they are counted, warned
    about and raised on like the rows the guard masks; unchanged with ``nonfinite="allow"``
    (no count) or when no selection ran. Device tensors only: no sync.

    Example:
        >>> from sbfunc.step.guard import count_unscorable
        >>> from sbfunc.step.records import Out
        >>> out = Out(torch.tensor(0.5), 8, 4, torch.tensor(False), torch.tensor(0),
        ...           torch.tensor(1))
        >>> count_unscorable(out, torch.tensor(2)).rows_nonfinite
        tensor(3)
    """
    counted = out.rows_nonfinite
    if counted is None or unscorable is None:
        return out
    return out._replace(rows_nonfinite=counted + unscorable.to(counted.device))


def raise_if_nonfinite(out: Out, step: int, replicas: Replicas) -> None:
    """``nonfinite="raise"``: raise ``FloatingPointError`` for a skipped update (on every rank
    when any rank had rows) or for rows left out of it. Reads the flags (a device sync)."""
    had_rows = out.samples_backpropagated > 0
    if (had_rows or replicas.collective) and bool(out.skipped) and replicas.any_rank(had_rows):
        where = " on some rank" if replicas.collective else ""
        raise FloatingPointError(
            f"step {step}: the loss or a gradient is not finite{where} (loss "
            f"{float(out.loss)}); the update was not applied. Pass nonfinite='skip' to "
            "make_train_step to skip such updates and count them instead"
        )
    bad = 0 if out.rows_nonfinite is None else int(out.rows_nonfinite)
    if bad:
        raise FloatingPointError(
            f"step {step}: {bad} of {out.samples_in_batch} rows have an input or loss that "
            "is not finite. Pass nonfinite='skip' to make_train_step to leave such rows out "
            "of the update and count them instead"
        )
