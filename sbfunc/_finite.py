"""Non-finite values: where they are, in a tensor, a batch's rows and a whole update.

One row of NaNs in an input poisons every gradient it touches (``0 * nan`` is ``nan`` in the
backward of a matrix product), so the training step finds the rows whose inputs are not finite
(:func:`finite_rows`) and replaces them before the forward (:func:`substitute_rows`); selection
ranks non-finite scores last (:func:`finite_entries`); an update is checked in one fused pass
(:func:`all_finite`) and kept from the state when it fails (:func:`keep_if_finite`, optax's
``apply_if_finite`` without a host sync). Shapes stay static and nothing syncs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.utils._pytree as torch_pytree

from sbfunc._rows import flat_tensors, walk
from sbfunc._tracing import host_readable
from sbfunc.types import Params, PerSample

__all__ = [
    "all_finite",
    "finite_entries",
    "finite_rows",
    "keep_if_finite",
    "known_finite",
    "substitute_rows",
    "trainable_rows",
    "update_finite",
]


def finite_entries(t: torch.Tensor) -> torch.Tensor:
    """``torch.isfinite(t)`` in two elementwise ops instead of its four (``abs``, ``ne``,
    ``eq``, ``mul``): ``t - t`` is exactly 0 for every finite value and NaN for NaN and
    ``±inf``. Every eager op is a kernel launch on an accelerator; under ``torch.compile``
    (which fuses either form) it is ``torch.isfinite`` itself.
    """
    if torch.compiler.is_compiling() or not (t.dtype.is_floating_point or t.dtype.is_complex):
        return torch.isfinite(t)
    return (t - t) == 0


def _float_rows(leaf: Any, size: int | None) -> bool:
    return size is not None and isinstance(leaf, torch.Tensor) and leaf.is_floating_point()


def finite_rows(batch: Any, *, per_sample: PerSample = None) -> torch.Tensor | None:
    """``Tensor[N]`` of bools: every floating-point per-sample tensor of the row is finite.

    Args:
        batch: any pytree batch.
        per_sample: which leaves are per-sample (:data:`sbfunc.types.PerSample`).

    Returns:
        The mask, or ``None`` when the batch has no floating-point per-sample tensor.
    """
    found: list[torch.Tensor] = []

    def check(leaf: torch.Tensor) -> None:
        finite = finite_entries(leaf)
        found.append(finite.flatten(1).all(1) if leaf.dim() > 1 else finite)

    def visit(path: tuple[Any, ...], leaf: Any, size: int | None) -> Any:
        if _float_rows(leaf, size):
            check(leaf)
        return leaf

    flat = _flat(batch, per_sample)
    if flat is not None:  # the hot path: a tuple/list/dict of tensors, no tree walk
        for leaf in flat:
            if leaf.is_floating_point():
                check(leaf)
    else:
        walk(batch, per_sample, visit, rebuild=False)
    if not found:
        return None
    ok = found[0]
    for more in found[1:]:
        ok = ok & more
    return ok


def known_finite(scores: torch.Tensor, batch: Any, *, per_sample: PerSample = None) -> bool:
    """Whether every score and every row of ``batch`` is finite, known for free eagerly on the
    CPU (so that no row can count as unscorable, whatever a selection keeps): every score
    finite (a fresh score of a row the loss cannot use is NaN:
    ``sbfunc.score.unusable_as_nan``) and every floating-point tensor of a tuple/list/dict
    batch finite, each read on the host as one sum (a sum that overflows sends the caller to
    the exact count). ``False`` when that cannot be read (an accelerator, tracing, another
    batch structure): count with tensors.

    Example:
        >>> batch = (torch.randn(4, 2), torch.arange(4))
        >>> known_finite(torch.ones(4), batch), known_finite(torch.ones(4) / 0, batch)
        (True, False)
    """
    if per_sample is not None or flat_tensors(batch) < 0 or not _finite_sum(scores):
        return False
    leaves = batch.values() if type(batch) is dict else batch
    return all(_finite_sum(t) for t in leaves if t.is_floating_point())


def _finite_sum(t: torch.Tensor) -> bool:
    """Whether ``t`` is readable on the host and its sum finite (then every entry is)."""
    return host_readable(t) and math.isfinite(float(t.sum()))


def trainable_rows(
    batch: Any, usable: torch.Tensor | None, *, per_sample: PerSample = None
) -> torch.Tensor | None:
    """``Tensor[N]`` of bools: the rows a step can train on, their floating-point inputs
    finite (:func:`finite_rows`) and ``usable`` (what the loss knows: a real target token, a
    real attention position; ``None``: every row); ``None`` when nothing can be wrong."""
    ok = finite_rows(batch, per_sample=per_sample)
    if usable is None:
        return ok
    return usable if ok is None else ok & usable.to(ok.device)


def substitute_rows(batch: Any, ok: torch.Tensor, *, per_sample: PerSample = None) -> Any:
    """``batch`` with every row where ``ok`` is false replaced by a copy of the first row where
    it holds, in every per-sample tensor (a new batch; the input is not modified).

    A row that cannot be trained on (a non-finite input, no real token, an attention mask with
    no real position) is removed from the computation before the forward: its values never
    reach a shared tensor, while the batch keeps its shape (no host read, one compiled graph);
    the step then gives the copy no weight. With no row ok, the batch is unchanged.
    """
    n = ok.shape[0]
    if n == 0:  # no row to replace (a refill step with nothing queued yet)
        return batch
    source = torch.where(ok, torch.arange(n, device=ok.device), ok.to(torch.int8).argmax())

    def substitute(leaf: torch.Tensor) -> torch.Tensor:
        return leaf.index_select(0, source.to(leaf.device))

    def visit(path: tuple[Any, ...], leaf: Any, size: int | None) -> Any:
        return substitute(leaf) if size is not None and isinstance(leaf, torch.Tensor) else leaf

    if _flat(batch, per_sample) is not None:
        if type(batch) is dict:
            return {k: substitute(t) for k, t in batch.items()}
        return type(batch)(substitute(t) for t in batch)
    return walk(batch, per_sample, visit, rebuild=True)


def _flat(batch: Any, per_sample: PerSample) -> list[torch.Tensor] | None:
    """The tensors of a tuple/list/dict of per-sample tensors (the default rule), else
    ``None``."""
    if per_sample is not None or flat_tensors(batch) < 0:
        return None
    return list(batch.values() if type(batch) is dict else batch)


def all_finite(
    tensors: Iterable[torch.Tensor], *, finite: torch.Tensor | None = None
) -> torch.Tensor:
    """A 0-d bool tensor: every entry of every tensor is finite (and ``finite``, when given).

    One fused pass per device, without a host sync: the kernel ``torch.amp.GradScaler`` uses to
    find non-finite gradients, with a scale of exactly 1, which leaves every value as it is (it
    writes each tensor with itself, bit for bit, and does not advance ``_version``; a tensor
    whose elements share memory, such as a gradient returned as an expanded view, is checked
    on a contiguous copy). About 10x cheaper on the CPU than a max-norm per tensor.

    Args:
        tensors: floating-point or complex tensors, on any devices.
        finite: a 0-d bool tensor to combine with (the result lives on its device).

    Returns:
        The flag, on the device of ``finite`` or of the first tensor (the CPU for none).

    Example:
        >>> from sbfunc import optim
        >>> optim.all_finite([torch.tensor([1.0, float("nan")])], finite=torch.tensor(True))
        tensor(False)

    References:
        PyTorch ``torch.amp.GradScaler`` (``_amp_foreach_non_finite_check_and_unscale_``);
        DeepMind optax ``apply_if_finite``.
    """
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for t in tensors:
        if any(s == 0 and n > 1 for s, n in zip(t.stride(), t.shape, strict=True)):
            t = t.contiguous()  # the kernel writes each tensor: no two elements may alias
        if t.is_complex():  # (the kernel has no complex version: the parts, as torch.optim)
            t = torch.view_as_real(t)
        by_device.setdefault(t.device, []).append(t)
    for device, group in by_device.items():
        found = torch.zeros((), device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(
            group, found, torch.ones((), device=device)
        )
        flag = found == 0
        finite = flag if finite is None else finite & flag.to(finite.device)
    return torch.ones((), dtype=torch.bool) if finite is None else finite


def keep_if_finite(finite: torch.Tensor, new: Any, old: Any) -> Any:
    """``new`` where ``finite`` holds, else ``old``, leaf by leaf over matching pytrees.

    Non-tensor leaves come from ``new``. This is how a non-finite update never reaches the
    parameters or a state without a host sync (cf. optax ``apply_if_finite``).

    Args:
        finite: a 0-d bool tensor.
        new: the values to keep when ``finite`` holds.
        old: the values to keep otherwise, with the structure of ``new``.

    Returns:
        The selected pytree (new tensors: one ``torch.where`` per leaf).

    Example:
        >>> from sbfunc import optim
        >>> optim.keep_if_finite(torch.tensor(False), {"w": torch.ones(2)}, {"w": torch.zeros(2)})
        {'w': tensor([0., 0.])}

    References:
        DeepMind optax ``apply_if_finite``.
    """

    def pick(n: Any, o: Any) -> Any:
        if isinstance(n, torch.Tensor) and isinstance(o, torch.Tensor):
            return torch.where(finite, n, o)
        return n

    return torch_pytree.tree_map(pick, new, old)


def update_finite(loss: torch.Tensor, grads: Params) -> torch.Tensor:
    """A 0-d bool tensor: the loss and every gradient entry are finite (no sync): the loss's
    ``isfinite`` and :func:`all_finite` over the gradients (GradScaler's fused
    check at scale 1, which leaves every value as it is). Inside a compiled graph it is one
    ``isfinite(...).all()`` per tensor instead: reductions the compiler fuses into the kernels
    that read the gradients anyway (the in-place GradScaler kernel is an opaque call there;
    ``benchmarks/host_overhead.py`` measured the compiled zero-compute step 18% faster).

    Example:
        >>> update_finite(torch.tensor(1.0), {"w": torch.tensor([1.0, float("nan")])})
        tensor(False)

    References:
        PyTorch ``torch.amp.GradScaler`` (``_amp_foreach_non_finite_check_and_unscale_``);
        optax ``apply_if_finite``.
    """
    if torch.compiler.is_compiling():
        finite = torch.isfinite(loss).all()
        for g in grads.values():  # a chain of &: one 0-d buffer fewer than a stack per tensor
            finite = finite & torch.isfinite(g).all()
        return finite
    return all_finite(grads.values(), finite=finite_entries(loss))
