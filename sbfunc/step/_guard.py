"""The step's non-finite policy, one component: :class:`NonFiniteGuard`.

``make_train_step(..., nonfinite=...)`` picks it: ``"skip"`` (the default) leaves a corrupt row
out of the update and keeps a non-finite update from the state, counting both; ``"raise"``
raises ``FloatingPointError`` instead (reading the flags syncs); ``"allow"`` applies every
update as it is and counts nothing. The guard acts at three points of the step: before the
forward it replaces the rows the step cannot train on (an input that is not finite; for a
:func:`sbfunc.per_sample_loss`, a row without a real target token or attention position) by a
copy of a usable row given no weight (:meth:`NonFiniteGuard.mask`), so they never reach a
shared tensor and the rest of the batch trains; after the update it keeps the old parameters,
optimizer state and buffers when the loss or a gradient is not finite (:meth:`NonFiniteGuard.keep`,
as optax ``apply_if_finite``, without a host sync; a loss scale's backed-off scale is kept,
:func:`opt_state_on_skip`); and it counts the rows left out (:meth:`NonFiniteGuard.rows_left_out`),
with those a selection left out for a non-finite score, and raises on them with ``"raise"``
(:meth:`NonFiniteGuard.check`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import torch

from sbfunc._finite import keep_if_finite, substitute_rows, trainable_rows, update_finite
from sbfunc._tracing import host_flag
from sbfunc.engine.internal import Carry
from sbfunc.optim import LossScaleState
from sbfunc.step._records import CoreOutputs
from sbfunc.step._replicas import Replicas
from sbfunc.types import Params, PerSample

__all__ = ["NonFinite", "NonFiniteGuard", "opt_state_on_skip"]

NonFinite = Literal["skip", "raise", "allow"]
"""``make_train_step``'s ``nonfinite`` values."""


class NonFiniteGuard(NamedTuple):
    """What a step does with values that are not finite (see the module docs).

    Attributes:
        mode: ``"skip"``, ``"raise"`` or ``"allow"``.
        per_sample: the batch's per-sample spec (:data:`sbfunc.types.PerSample`).

    Example:
        >>> guard = NonFiniteGuard("skip", None)
        >>> guard.keep(torch.tensor(float("nan")), {}, None, {"w": torch.ones(1)},
        ...            {"w": torch.zeros(1)})
        (tensor(False), {'w': tensor([0.])})

    References:
        optax ``apply_if_finite``; PyTorch ``torch.amp.GradScaler`` (skipped steps).
    """

    mode: NonFinite
    per_sample: PerSample
    usable: Callable[[Any], torch.Tensor | None] | None = None

    def rows_ok(self, batch: Any) -> torch.Tensor | None:
        """``Tensor[N]``: the rows a step can train on, their floating-point inputs finite
        and, when the loss can tell (``usable``: a real target token, a real attention
        position), usable; ``None`` when nothing can be wrong."""
        usable = None if self.usable is None else self.usable(batch)
        return trainable_rows(batch, usable, per_sample=self.per_sample)

    def mask(self, carry: Carry) -> tuple[Carry, torch.Tensor | None]:
        """``(carry, ok)``: the carry with the rows the step cannot train on replaced by a
        usable row's copy (:func:`substitute_rows`, given no weight) and the ``Tensor[N]`` mask
        of usable rows; ``(carry, None)`` as it came with ``"allow"``, when every row is known
        to be usable (eagerly on the CPU, where reading the flag costs no sync) or when
        nothing can be wrong."""
        if self.mode == "allow":
            return carry, None
        batch = carry.context.batch
        ok = self.rows_ok(batch)
        if ok is None or host_flag(ok.all()):
            return carry, None
        masked = substitute_rows(batch, ok, per_sample=self.per_sample)
        return carry._replace(context=carry.context._replace(batch=masked)), ok

    def keep(
        self, loss: torch.Tensor, grads: Params, apply: torch.Tensor | None, new: Any, old: Any
    ) -> tuple[torch.Tensor, Any]:
        """``(finite, new)`` when the loss and gradients are finite (always with ``"allow"``)
        and ``apply`` (the replicas' flag; ``None``: no flag) holds, else ``(finite, old)``,
        over matching pytrees (the state after and before the update). No host sync: one
        ``torch.where`` per tensor on a device or under the compiler; eagerly on the CPU the
        flag is a host value already, and a branch skips the selects."""
        checked = None if self.mode == "allow" else update_finite(loss, grads)
        if apply is not None:
            checked = apply if checked is None else checked & apply
        if checked is None:
            return torch.ones((), dtype=torch.bool, device=loss.device), new
        host = host_flag(checked)
        if host is not None:
            return checked, new if host else old
        return checked, keep_if_finite(checked, new, old)

    def rows_left_out(self, used: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
        """The rows the update left out for a non-finite input or loss, a 0-d ``int64``
        tensor on ``like``'s device (``used``: the rows the loss used; ``None``: all), or
        ``None`` with ``"allow"``."""
        if used is not None:
            return (~used).sum()
        return None if self.mode == "allow" else like.new_zeros(())

    def count_rows(
        self,
        used: torch.Tensor | None,
        like: torch.Tensor,
        unscorable: torch.Tensor | None,
        total: torch.Tensor | None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Inside the core: ``(this step's left-out rows, the run's count after it)``. The
        step's count adds the rows a selection left out for a non-finite score
        (``Context.rows_unscorable``) to :meth:`rows_left_out`'s, so they are warned about
        and raised on like the masked ones; ``total`` is the run's count so far (``None``:
        not kept)."""
        bad = self.rows_left_out(used, like)
        if bad is not None and unscorable is not None:
            bad = bad + unscorable.to(bad.device)
        if bad is None or total is None:
            return bad, total
        return bad, total + bad

    def check(self, out: CoreOutputs, step: int, replicas: Replicas) -> None:
        """On the host after the step: with ``"raise"``, raise for a skipped update or a
        left-out row (reads the flags: a sync); otherwise nothing.

        Raises:
            FloatingPointError: with ``"raise"``, for a skipped update (on every rank when any
                rank had rows) or for rows left out of it.
        """
        if self.mode == "raise":
            _raise_if_nonfinite(out, step, replicas)


def opt_state_on_skip(new: Any, old: Any) -> Any:
    """The optimizer state a skipped update keeps: ``old``, the state before it, except for
    :func:`sbfunc.optim.dynamic_loss_scale`, which handles a non-finite update itself: its new
    state (the scale backed off on an overflow, which must persist or the scale never
    shrinks) with the inner optimizer's state from before.

    Example:
        >>> from sbfunc.optim import LossScaleState
        >>> old, new = LossScaleState(torch.tensor(4.0), torch.tensor(7), "old"), "new"
        >>> opt_state_on_skip(LossScaleState(torch.tensor(2.0), torch.tensor(0), new), old)
        LossScaleState(scale=tensor(2.), good_steps=tensor(0), inner='old')
    """
    if isinstance(new, LossScaleState) and isinstance(old, LossScaleState):
        return new._replace(inner=old.inner)
    return old


def _raise_if_nonfinite(out: CoreOutputs, step: int, replicas: Replicas) -> None:
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
