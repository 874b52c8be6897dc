"""The spine type: per-sample loss functions ``loss_fn(params, buffers, batch) -> Tensor[N]``.

Every transform in sbfunc (scoring, selection, per-sample gradients, the training step) consumes
a *per-sample loss function*: a pure function of a parameter dict, a buffer dict and a pytree
batch that returns one loss per sample. This module bridges ``nn.Module`` + criterion to that
type with :func:`torch.func.functional_call`, and splits a module into detached dicts.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import nn
from torch.func import functional_call

from sbfunc.batch import Field, extract

__all__ = [
    "LossFn",
    "ModuleLoss",
    "Params",
    "per_sample_loss",
    "reduce_per_sample",
    "split_module",
]

Params = dict[str, torch.Tensor]


class LossFn(Protocol):
    """A pure per-sample loss function: ``(params, buffers, batch) -> Tensor[N]``."""

    def __call__(self, params: Params, buffers: Params, batch: Any, /) -> torch.Tensor: ...


def split_module(module: nn.Module, *, clone: bool = False) -> tuple[Params, Params]:
    """Split a module into detached ``params`` and ``buffers`` dicts, keyed by
    ``named_parameters()`` / ``named_buffers()`` names (a tied weight appears once; buffers
    registered with ``persistent=False`` are included), as ``functional_call`` expects.

    Args:
        module: any ``nn.Module``.
        clone: copy the tensors instead of sharing storage with the module. Use it when the
            functional code must never write into the module (BatchNorm in train mode updates
            running statistics in the buffers it is given).

    Returns:
        ``(params, buffers)``, each a ``dict[str, Tensor]`` with ``requires_grad=False``.

    Example:
        >>> params, buffers = sbfunc.split_module(torch.nn.BatchNorm1d(3))
        >>> sorted(params), sorted(buffers)
        (['bias', 'weight'], ['num_batches_tracked', 'running_mean', 'running_var'])

    References:
        PyTorch ``torch.func.functional_call`` and its per-sample-gradients tutorial
        (``{k: v.detach() for k, v in model.named_parameters()}``).
    """

    def copy(t: torch.Tensor) -> torch.Tensor:
        t = t.detach()
        return t.clone() if clone else t

    params = {k: copy(v) for k, v in module.named_parameters()}
    buffers = {k: copy(v) for k, v in module.named_buffers()}
    return params, buffers


def reduce_per_sample(losses: torch.Tensor, n: int | None = None) -> torch.Tensor:
    """Reduce element losses ``[N, ...]`` to per-sample losses ``[N]`` by the mean over the
    non-batch dimensions (token- or pixel-level losses count each sample once).

    Raises:
        ValueError: if ``losses`` is 0-d (a criterion that already reduced the batch) or its
            leading dimension is not ``n``.

    Example:
        >>> sbfunc.reduce_per_sample(torch.tensor([[1.0, 3.0], [2.0, 2.0]]))
        tensor([2., 2.])

    References:
        PyTorch losses with ``reduction='none'``; MosaicML Composer ``select_using_loss``
        (which needs one loss per sample from ``loss_fun(..., reduction='none')``).
    """
    if not isinstance(losses, torch.Tensor) or losses.dim() == 0:
        raise ValueError(
            "the loss must be per-sample, of shape [N] or [N, ...]; got a "
            + (
                f"0-d tensor {losses}"
                if isinstance(losses, torch.Tensor)
                else type(losses).__name__
            )
            + ". Use reduction='none' in the criterion."
        )
    if n is not None and losses.shape[0] != n:
        raise ValueError(
            f"the loss has leading dimension {losses.shape[0]} but the batch has {n} samples"
        )
    return losses if losses.dim() == 1 else losses.flatten(1).mean(dim=1)


def _accepts_reduction(fn: Callable[..., Any]) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature
        return False
    return "reduction" in sig.parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()
    )


def _per_element_criterion(criterion: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    if not callable(criterion):
        raise TypeError(f"criterion must be callable, got {type(criterion).__name__}")
    if isinstance(criterion, nn.Module):
        reduction = getattr(criterion, "reduction", "none")
        if reduction != "none":
            raise ValueError(
                f"criterion {type(criterion).__name__} has reduction={reduction!r}; "
                "per-sample losses need reduction='none'"
            )
        return criterion
    if _accepts_reduction(criterion):
        return lambda out, tgt: criterion(out, tgt, reduction="none")
    return criterion


def per_sample_loss(
    module: nn.Module,
    criterion: Callable[..., torch.Tensor],
    *,
    input: Field = 0,
    target: Field = 1,
    train: bool | None = False,
) -> ModuleLoss:
    """Bridge an ``nn.Module`` and a criterion to a per-sample loss function.

    The returned ``loss_fn(params, buffers, batch)`` runs
    ``functional_call(module, (params, buffers), (batch[input],))`` and
    ``criterion(outputs, batch[target])`` and reduces any trailing loss dimensions by their mean,
    returning ``Tensor[N]``. It is a pure function of its arguments, so ``torch.func.grad``,
    ``vmap`` and ``torch.compile`` compose with it.

    **Train or eval mode.** Dropout and BatchNorm make the loss depend on the module's mode.
    ``train=False`` (the default) evaluates the module in eval mode: scores are deterministic,
    independent of the other samples in the batch, and scoring never writes BatchNorm running
    statistics (Composer scores in train mode, so its dropout adds noise to the ranking and a
    downsampled scoring pass pollutes the running statistics). For the training loss itself
    build a second function with ``train=True``. ``train=None`` uses the module's mode at call
    time. The mode is set for the duration of the call and restored afterwards.

    Args:
        module: the model; its own tensors are used only for names missing from the dicts.
        criterion: ``criterion(outputs, targets)``. An ``nn.Module`` loss must have
            ``reduction='none'``; a function that accepts ``reduction`` (such as
            ``torch.nn.functional.cross_entropy``) is called with ``reduction='none'``.
        input: where the model input sits in the batch: an int index (tuple batches), a str key
            (dict batches) or a callable ``batch -> input``.
        target: where the target sits, same forms as ``input``.
        train: the module mode during the call (see above).

    Returns:
        A :class:`ModuleLoss`: a :class:`LossFn` that also exposes ``forward`` and
        ``criterion`` separately and ``with_train(mode)``.

    Raises:
        TypeError: if ``criterion`` is not callable.
        ValueError: if an ``nn.Module`` criterion reduces the batch.

    Example:
        >>> model = torch.nn.Linear(3, 2)
        >>> loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy)
        >>> params, buffers = sbfunc.split_module(model)
        >>> loss_fn(params, buffers, (torch.randn(5, 3), torch.tensor([0, 1, 0, 1, 1]))).shape
        torch.Size([5])

    References:
        Jiang et al. 2019, "Accelerating Deep Learning by Focusing on the Biggest Losers".
    """
    return ModuleLoss(module, criterion, input=input, target=target, train=train)


class ModuleLoss:
    """A :class:`LossFn` built from a module and a criterion, split into its two halves.

    Calling it is ``criterion(forward(params, buffers, batch), batch)``. The halves let the
    training step run the forward, fire ``AFTER_FORWARD``/``BEFORE_LOSS``, then the loss (so
    algorithms can change targets in between, as Composer's events promise). Build it with
    :func:`per_sample_loss`.

    Example:
        >>> loss_fn = sbfunc.per_sample_loss(torch.nn.Linear(2, 2), torch.nn.functional.mse_loss)
        >>> params, buffers = sbfunc.split_module(torch.nn.Linear(2, 2))
        >>> out = loss_fn.forward(params, buffers, (torch.ones(3, 2), torch.zeros(3, 2)))
        >>> loss_fn.criterion(out, (torch.ones(3, 2), torch.zeros(3, 2))).shape
        torch.Size([3])

    References:
        MosaicML Composer ``ComposerModel.forward(batch)`` and ``ComposerModel.loss(outputs,
        batch)``, with the ``AFTER_FORWARD``/``BEFORE_LOSS`` events between them; PyTorch
        ``torch.func.functional_call``.
    """

    def __init__(
        self,
        module: nn.Module,
        criterion: Callable[..., torch.Tensor],
        *,
        input: Field = 0,
        target: Field = 1,
        train: bool | None = False,
    ) -> None:
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be an nn.Module, got {type(module).__name__}")
        if train is not None and not isinstance(train, bool):
            raise TypeError(f"train must be True, False or None, got {train!r}")
        self.module = module
        self.raw_criterion = criterion
        self._criterion = _per_element_criterion(criterion)
        self.input, self.target, self.train = input, target, train

    def with_train(self, train: bool | None) -> ModuleLoss:
        """The same loss with another train/eval mode (e.g. eval-mode scoring of a train loss).

        Example:
            >>> mse = torch.nn.functional.mse_loss
            >>> sbfunc.per_sample_loss(torch.nn.Linear(2, 2), mse).with_train(True).train
            True
        """
        return ModuleLoss(
            self.module, self.raw_criterion, input=self.input, target=self.target, train=train
        )

    def forward(self, params: Params, buffers: Params, batch: Any) -> Any:
        """The module's outputs on the batch's input, in this loss's train/eval mode."""
        x = extract(batch, self.input, "input")
        module, was_training = self.module, self.module.training
        if self.train is not None and self.train != was_training:
            module.train(self.train)
        try:
            return functional_call(module, (params, buffers), (x,))
        finally:
            if module.training != was_training:
                module.train(was_training)

    def criterion(self, outputs: Any, batch: Any) -> torch.Tensor:
        """Per-sample losses ``[N]`` of ``outputs`` against the batch's target."""
        losses = self._criterion(outputs, extract(batch, self.target, "target"))
        n = outputs.shape[0] if isinstance(outputs, torch.Tensor) and outputs.dim() > 0 else None
        return reduce_per_sample(losses, n)

    def __call__(self, params: Params, buffers: Params, batch: Any) -> torch.Tensor:
        return self.criterion(self.forward(params, buffers, batch), batch)

    def __repr__(self) -> str:
        return (
            f"ModuleLoss({type(self.module).__name__}, input={self.input!r}, "
            f"target={self.target!r}, train={self.train})"
        )
