"""How a step's gradient combines with other processes' steps: the step's ``replicas``.

A training step is the same code in one process and in data parallelism; what differs is a
small component passed to :func:`sbfunc.make_train_step` (``replicas=``), not a subclass of
the step. It answers five questions at fixed points of the step:

1. ``share``: at ``step.init``, which parameters, buffers and root key every process starts
   from (data parallelism: rank 0's);
2. ``model_key``: the key the model's random operations (dropout) draw from;
3. ``mean``: between ``BEFORE_BACKWARD`` and ``AFTER_BACKWARD``, the gradient and loss of
   the step from this process's (and the others') kept rows, and whether to apply the update;
4. ``sync_buffers``: the buffers (BatchNorm statistics) every process keeps after the step;
5. ``any_rank``: whether a host flag holds on some process (``nonfinite="raise"`` raises on
   every rank when one had rows).

``collective`` says whether a process left with zero rows still runs the step (another may
have rows, and the collective must run on every process). :data:`ONE_PROCESS`, the default,
answers every question with this process's own values; :class:`sbfunc.distributed.DataParallel`
is the data-parallel answer.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from sbfunc.engine.internal import Carry
from sbfunc.step._records import Gradients
from sbfunc.types import Params

__all__ = ["ONE_PROCESS", "OneProcess", "Replicas", "no_rows_here"]


@runtime_checkable
class Replicas(Protocol):
    """What a training step asks about the other processes (see the module docs)."""

    @property
    def collective(self) -> bool:
        """Whether a process left with zero rows still runs the step."""
        ...

    def share(
        self, params: Params, buffers: Params, key: torch.Tensor
    ) -> tuple[Params, Params, torch.Tensor]:
        """The parameters, buffers and root key this process starts from."""
        ...

    def model_key(self, key: torch.Tensor) -> torch.Tensor:
        """This process's key for the model's random operations, from the step's key."""
        ...

    def mean(
        self, grads: Params, loss: torch.Tensor, rows: int
    ) -> tuple[Params, torch.Tensor, torch.Tensor | None]:
        """The step's gradient and loss from this process's (means over its ``rows`` rows),
        and a 0-d bool tensor saying whether to apply the update (``None``: as usual)."""
        ...

    def sync_buffers(self, buffers: Params) -> Params:
        """The buffers every process keeps after the step."""
        ...

    def any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` holds on some process (a collective on the host)."""
        ...


class OneProcess:
    """A single process: every answer is this process's own value.

    Example:
        >>> from sbfunc.step import ONE_PROCESS
        >>> grads, loss, apply = ONE_PROCESS.mean({"w": torch.ones(1)}, torch.tensor(2.0), 4)
        >>> grads, loss, apply
        ({'w': tensor([1.])}, tensor(2.), None)
    """

    collective = False

    def share(
        self, params: Params, buffers: Params, key: torch.Tensor
    ) -> tuple[Params, Params, torch.Tensor]:
        return params, buffers, key

    def model_key(self, key: torch.Tensor) -> torch.Tensor:
        return key

    def mean(
        self, grads: Params, loss: torch.Tensor, rows: int
    ) -> tuple[Params, torch.Tensor, torch.Tensor | None]:
        return grads, loss, None

    def sync_buffers(self, buffers: Params) -> Params:
        return buffers

    def any_rank(self, flag: bool) -> bool:
        return flag

    def __repr__(self) -> str:
        return "ONE_PROCESS"


ONE_PROCESS = OneProcess()
"""The default :class:`Replicas`: one process, no collective."""


def no_rows_here(carry: Carry, device: torch.device) -> Gradients:
    """What a process left with zero rows contributes when the others may have some (a
    ``collective`` step runs on every process): zero gradients, a zero loss, no per-sample
    losses or outputs, and no row backpropagated (the loss on ``device``): the
    :class:`~sbfunc.step._records.Gradients` of no row.

    Example:
        >>> from sbfunc.engine import Context
        >>> from sbfunc.engine.internal import Carry
        >>> carry = Carry(Context(None, {"w": torch.ones(2)}, {}, ()), (), ())
        >>> no_rows_here(carry, torch.device("cpu"))[1:]
        ({'w': tensor([0., 0.])}, tensor(0.), None, 0, None)
    """
    context = carry.context
    grads = {k: torch.zeros_like(v) for k, v in context.params.items()}
    loss = torch.zeros((), device=device)
    context = context._replace(loss=loss, losses=loss.new_zeros(0), outputs=None)
    return Gradients(carry._replace(context=context), grads, loss, None, 0)
