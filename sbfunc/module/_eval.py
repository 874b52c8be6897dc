"""Evaluation as a pure function: a model's outputs and per-sample losses from
``(params, buffers, batch)`` in eval mode, never writing the buffers.

``torch.func.functional_call(model, (params, buffers), (x,))`` runs the model in whatever mode
it was left in. After a training step (``mode="train"``) that is train mode, so a model with
BatchNorm normalises with batch statistics and writes the running statistics, and
``num_batches_tracked``, into the ``buffers`` it was given: a state that was meant to be
immutable changes. :func:`predict` and :func:`eval_outputs` run in eval mode (dropout off,
running statistics read, not written) on copies of the buffers, and restore every
submodule's own mode afterwards.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn
from torch.func import functional_call

from sbfunc.module._io import Inputs, check_inputs, module_mode, read_inputs
from sbfunc.module._loss import ModuleLoss
from sbfunc.module._state import check_state
from sbfunc.types import Params

__all__ = ["EvalOutputs", "eval_outputs", "predict"]


def _copies(buffers: Params) -> Params:
    """Copies of the buffers: a layer that writes its buffers even in eval mode (a custom one)
    writes these, never the caller's."""
    return {name: b.clone() for name, b in buffers.items()}


def predict(
    module: nn.Module | ModuleLoss,
    params: Params,
    buffers: Params,
    /,
    *args: Any,
    input: Inputs | None = None,
    **kwargs: Any,
) -> Any:
    """The module's outputs ``module(*args, **kwargs)`` in eval mode with ``params`` and
    ``buffers``, a pure function: nothing it is given is written.

    Equal to ``module.eval()(*args, **kwargs)`` with the module's tensors replaced by the
    dicts, without its side effects: the module's mode (and every submodule's) is the same
    afterwards, and the buffers are passed as copies, so BatchNorm's running statistics and
    ``num_batches_tracked`` are never written, whatever mode the module was left in.
    Gradients flow to ``params`` that require them; wrap the call in ``torch.no_grad()`` for
    evaluation only.

    **A batch.** ``predict(module, params, buffers, batch, input=...)`` reads the module's
    arguments from one batch as :func:`sbfunc.per_sample_loss` does (an index, a key, a
    callable, a tuple of keys passed as keyword arguments, ...: :data:`Inputs`), so a dict
    batch of a Hugging Face model evaluates as it trains:
    ``input=("input_ids", "attention_mask")``. ``predict(loss_fn, params, buffers, batch)``
    with a :class:`ModuleLoss` reads the batch with the loss's own ``input`` and returns the
    logits its ``output`` selects (the module's result when ``output=None``).

    Args:
        module: the model, or a :class:`ModuleLoss` from :func:`sbfunc.per_sample_loss` (then
            the only argument is the batch).
        params: parameter dict, e.g. ``state.params``: the module's names and shapes (dtypes
            may differ; see :func:`sbfunc.module.check_state` for what else is allowed).
        buffers: buffer dict, e.g. ``state.buffers``; never modified.
        *args: the module's positional arguments; with ``input``, the batch alone.
        input: where the module's arguments sit in the batch (:data:`Inputs`, as in
            :func:`sbfunc.per_sample_loss`); ``None`` (the default): ``args`` and ``kwargs``
            are the module's arguments as given. A tensor passed as ``input=`` is the module's
            own keyword argument (torch's layers name their argument ``input``), as in 1.0.
        **kwargs: the module's keyword arguments (with ``input``, added to those read from
            the batch).

    Returns:
        What the module returns; with a :class:`ModuleLoss`, the logits its ``output`` reads.

    Raises:
        ValueError: if ``params``/``buffers`` miss some of the module's names, have others or
            other shapes (the parameters of another model), naming each; checked before the
            module runs.
        TypeError: with ``input`` or a :class:`ModuleLoss`, for anything but one batch (and,
            with a loss, any keyword argument), or for a keyword given twice; an ``input`` of
            another form (see :func:`sbfunc.per_sample_loss`).
        KeyError, IndexError: for a field the batch lacks (the message lists those it has).

    Example:
        >>> model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
        >>> params, buffers = sbfunc.split_module(model, clone=True)
        >>> logits = sbfunc.predict(model, params, buffers, torch.randn(4, 3))
        >>> logits.shape, int(buffers["1.num_batches_tracked"]), model.training
        (torch.Size([4, 2]), 0, True)

        The module's argument read from a dict batch, or by the loss that trains it:

        >>> batch = {"x": torch.randn(4, 3), "y": torch.tensor([0, 1, 1, 0])}
        >>> by_name = sbfunc.predict(model, params, buffers, batch, input="x")
        >>> loss_fn = sbfunc.per_sample_loss(
        ...     model, torch.nn.functional.cross_entropy, input="x", target="y")
        >>> torch.equal(by_name, sbfunc.predict(loss_fn, params, buffers, batch))
        True

    References:
        PyTorch ``torch.func.functional_call`` and ``nn.Module.eval``; Hugging Face
        Transformers model signatures (``input_ids``, ``attention_mask``).
    """
    if isinstance(module, ModuleLoss):
        if len(args) != 1 or kwargs or input is not None:
            raise TypeError(
                "predict(loss_fn, params, buffers, batch) takes one batch and reads the "
                "module's arguments with the loss's own input=; pass the module itself for "
                "other arguments"
            )
        check_state(module, params, buffers)
        loss_fn = module if module.mode in ("eval", "auto") else module.with_mode("eval")
        return loss_fn.forward(params, _copies(buffers), args[0])
    if isinstance(input, torch.Tensor):  # 1.0: the module's own keyword argument
        kwargs, input = {**kwargs, "input": input}, None
    if input is not None:
        args, kwargs = _read_batch(args, kwargs, input)
    check_state(module, params, buffers, name="module")
    with module_mode(module, False) as m:
        return functional_call(m, (params, _copies(buffers)), args, kwargs)


def _read_batch(
    args: tuple[Any, ...], kwargs: dict[str, Any], input: Inputs
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The module's ``(args, kwargs)`` read from the one batch in ``args`` by ``input``, the
    keyword arguments given beside it added."""
    if len(args) != 1:
        raise TypeError(
            f"predict(module, params, buffers, batch, input=...) takes one batch, got "
            f"{len(args)} positional arguments"
        )
    read_args, read_kwargs = read_inputs(args[0], check_inputs(input))
    twice = sorted(read_kwargs.keys() & kwargs.keys())
    if twice:
        raise TypeError(f"predict got {twice} both from the batch (input=) and as keywords")
    return read_args, {**read_kwargs, **kwargs}


class EvalOutputs(NamedTuple):
    """What :func:`eval_outputs` returns.

    Attributes:
        outputs: the logits, read from the module's result by the loss's ``output``.
        losses: the per-sample losses ``[N]``.

    Example:
        >>> out = sbfunc.module.EvalOutputs(torch.zeros(2, 3), torch.ones(2))
        >>> out.losses
        tensor([1., 1.])

    References:
        MosaicML Composer ``ComposerModel.eval_forward`` (outputs for the metrics).
    """

    outputs: Any
    losses: torch.Tensor


def eval_outputs(loss_fn: ModuleLoss, params: Params, buffers: Params, batch: Any) -> EvalOutputs:
    """The logits and per-sample losses of ``loss_fn`` on ``batch`` in eval mode, a pure
    function: nothing it is given is written.

    Whatever ``loss_fn.mode`` says (``"train"`` for a training loss included), the module runs
    in eval mode on copies of the buffers, as in :func:`predict`; the batch is read with the
    loss's own ``input``, ``target`` and ``output``. Use it for evaluation (an ``eval_fn`` for
    :func:`sbfunc.fit`) and wherever eval-mode losses and logits are both needed.

    Args:
        loss_fn: a :class:`~sbfunc.module.ModuleLoss` from :func:`sbfunc.per_sample_loss`.
        params: parameter dict, e.g. ``state.params``.
        buffers: buffer dict, e.g. ``state.buffers``; never modified.
        batch: any pytree batch the loss reads.

    Returns:
        :class:`EvalOutputs` ``(outputs, losses)``.

    Raises:
        TypeError: if ``loss_fn`` is not a :class:`~sbfunc.module.ModuleLoss` (a hand-written loss
            function has no separate logits nor a mode to set).
        ValueError: if ``params``/``buffers`` do not match ``loss_fn.module`` (names and
            shapes, as for :func:`predict`).

    Example:
        >>> model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Dropout(0.5))
        >>> loss_fn = sbfunc.per_sample_loss(
        ...     model, torch.nn.functional.cross_entropy, mode="train")
        >>> params, buffers = sbfunc.split_module(model, clone=True)
        >>> batch = (torch.randn(4, 3), torch.tensor([0, 1, 1, 0]))
        >>> out = sbfunc.module.eval_outputs(loss_fn, params, buffers, batch)
        >>> accuracy = (out.outputs.argmax(1) == batch[1]).float().mean()
        >>> out.losses.shape, bool(torch.equal(out.losses, loss_fn.with_mode("eval")(
        ...     params, buffers, batch)))
        (torch.Size([4]), True)

    References:
        MosaicML Composer ``ComposerModel.eval_forward``; PyTorch ``nn.Module.eval``.
    """
    if not isinstance(loss_fn, ModuleLoss):
        raise TypeError(
            "loss_fn must be a ModuleLoss made by sbfunc.per_sample_loss(model, criterion), "
            f"got {type(loss_fn).__name__}; for a bare module use sbfunc.predict"
        )
    check_state(loss_fn, params, buffers)
    if loss_fn.mode not in ("eval", "auto"):
        loss_fn = loss_fn.with_mode("eval")
    outputs = loss_fn.forward(params, _copies(buffers), batch)
    return EvalOutputs(outputs, loss_fn.criterion(outputs, batch))
