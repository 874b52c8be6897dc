"""The spine type: per-sample loss functions ``loss_fn(params, buffers, batch) -> Tensor[N]``.

Every transform in sbfunc (scoring, selection, per-sample gradients, the training step) consumes
a *per-sample loss function*: a pure function of a parameter dict, a buffer dict and a pytree
batch that returns one loss per sample. This module bridges ``nn.Module`` + criterion to that
type with :func:`torch.func.functional_call`, and splits a module into detached dicts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from sbfunc.batch import Field, extract
from sbfunc.module._checks import accepts_reduction, check_target, target_kind
from sbfunc.module._io import (
    Inputs,
    Mode,
    Output,
    check_inputs,
    check_mode,
    check_output,
    mode_flag,
    module_mode,
    read_inputs,
    select_output,
)
from sbfunc.module._state import check_state
from sbfunc.module._tokens import TokenLosses, TokenTargets, token_losses_of
from sbfunc.types import Params

__all__ = ["ModuleLoss", "per_sample_loss", "reduce_per_sample", "split_module"]


def split_module(module: nn.Module, *, clone: bool = False) -> tuple[Params, Params]:
    """Split a module into detached ``params`` (what trains) and ``buffers`` (what does not)
    dicts, keyed by ``named_parameters()`` / ``named_buffers()`` names (a tied weight appears
    once; buffers registered with ``persistent=False`` are included), as ``functional_call``
    expects.

    A parameter whose ``requires_grad`` is ``False`` (a frozen base, LoRA's frozen weights,
    partial fine-tuning) goes to ``buffers``: the training step differentiates, updates and
    decays only ``params``, so a frozen parameter stays bit for bit what it was and costs no
    gradient work (equinox's ``partition`` of a model by a filter; optax leaves what it is not
    given alone).

    Args:
        module: any ``nn.Module``.
        clone: copy the tensors instead of sharing storage with the module. Use it when the
            functional code must never write into the module (BatchNorm in train mode updates
            running statistics in the buffers it is given).

    Returns:
        ``(params, buffers)``, each a ``dict[str, Tensor]`` with ``requires_grad=False``:
        the trainable parameters, then the frozen parameters and the buffers.

    Example:
        >>> params, buffers = sbfunc.split_module(torch.nn.BatchNorm1d(3))
        >>> sorted(params), sorted(buffers)
        (['bias', 'weight'], ['num_batches_tracked', 'running_mean', 'running_var'])
        >>> frozen = torch.nn.Linear(2, 2).requires_grad_(False)
        >>> model = torch.nn.Sequential(frozen, torch.nn.Linear(2, 1))
        >>> params, buffers = sbfunc.split_module(model)
        >>> sorted(params), sorted(buffers)
        (['1.bias', '1.weight'], ['0.bias', '0.weight'])

    References:
        PyTorch ``torch.func.functional_call`` and its per-sample-gradients tutorial
        (``{k: v.detach() for k, v in model.named_parameters()}``); equinox ``partition``.
    """

    def copy(t: torch.Tensor) -> torch.Tensor:
        t = t.detach()
        return t.clone() if clone else t

    params: Params = {}
    buffers: Params = {}
    for k, v in module.named_parameters():
        (params if v.requires_grad else buffers)[k] = copy(v)
    buffers.update((k, copy(v)) for k, v in module.named_buffers())
    return params, buffers


def reduce_per_sample(losses: torch.Tensor, n: int | None = None) -> torch.Tensor:
    """Reduce element losses ``[N, ...]`` to per-sample losses ``[N]`` by the mean over the
    non-batch dimensions (token- or pixel-level losses count each sample once).

    Raises:
        ValueError: if ``losses`` is 0-d (a criterion that already reduced the batch) or its
            leading dimension is not ``n``.

    Example:
        >>> sbfunc.module.reduce_per_sample(torch.tensor([[1.0, 3.0], [2.0, 2.0]]))
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
            + ". Use a criterion with reduction='none' (torch's losses take it); for a "
            "language model, sbfunc.module.next_token_cross_entropy with output='logits' "
            "(a Hugging Face model's .loss and loss_function reduce the batch to one number)"
        )
    if n is not None and losses.shape[0] != n:
        raise ValueError(
            f"the loss has leading dimension {losses.shape[0]} but the batch has {n} samples"
        )
    return losses if losses.dim() == 1 else losses.flatten(1).mean(dim=1)


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
    raw = getattr(criterion, "func", criterion)  # functools.partial
    if str(getattr(raw, "__module__", "")).startswith("transformers.loss"):
        raise ValueError(_HF_LOSS.format(getattr(raw, "__name__", repr(raw))))
    if accepts_reduction(criterion):
        return lambda out, tgt: criterion(out, tgt, reduction="none")
    return criterion


_HF_LOSS = (
    "criterion is Hugging Face's {0} (a model's loss_function), which averages the whole "
    "batch into one number and takes no reduction: per-sample losses need one loss per row. "
    "Use sbfunc.module.next_token_cross_entropy (the same loss per token: Hugging Face's "
    "shift, -100 ignored) or sbfunc.module.token_cross_entropy, with output='logits'"
)


def per_sample_loss(
    module: nn.Module,
    criterion: Callable[..., torch.Tensor],
    *,
    input: Inputs = 0,
    target: Field = 1,
    output: Output = None,
    mode: Mode = "auto",
    ignore_index: int | None = -100,
    attention_mask: Field | None = "auto",
) -> ModuleLoss:
    """Bridge an ``nn.Module`` and a criterion to a per-sample loss function.

    The returned ``loss_fn(params, buffers, batch)`` runs the module with
    ``functional_call(module, (params, buffers), args, kwargs)`` on the batch's ``input``
    fields, reads the logits from its result with ``output``, computes
    ``criterion(logits, batch[target])`` and reduces any trailing loss dimensions by their mean,
    returning ``Tensor[N]``. It is a pure function of its arguments, so ``torch.func.grad``,
    ``vmap`` and ``torch.compile`` compose with it.

    **Several inputs, structured outputs.** ``input=("input_ids", "attention_mask")`` calls
    ``module(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])``;
    ``output="logits"`` reads ``result.logits`` (or ``result["logits"]``), ``output=0`` reads
    ``result[0]``. The selection happens in :meth:`ModuleLoss.forward`, so what the training
    step differentiates (and what ``AFTER_FORWARD`` algorithms see as the outputs) is the logits
    tensor: ``torch.func.vjp`` accepts only tensors, not ``(logits, None)``, dataclasses or
    ``ModelOutput`` objects. With ``output=None`` such a result is refused with a message that
    lists its fields.

    **Train or eval mode.** Dropout and BatchNorm make the loss depend on the module's mode.
    ``mode="auto"`` (the default) is one function for both uses: called directly (scoring,
    per-sample quantities, evaluation) it runs the module in eval mode, exactly as
    ``mode="eval"`` does, so scores are deterministic, independent of the other samples in the
    batch, and never write BatchNorm running statistics (Composer scores in train mode, so its
    dropout adds noise to the ranking and a downsampled scoring pass pollutes the running
    statistics); the training step trains it in train mode (``with_mode("train")``).
    ``mode="train"``/``"eval"`` fix the mode everywhere; ``mode="module"`` uses the module's
    own mode at call time. The mode is set for the duration of the call and every submodule's
    own mode is restored afterwards.

    **Checked early.** The criterion's target is checked on every call from its dtype and
    shape only (no host sync): a float target of shape ``[N]`` for cross-entropy or NLL raises
    ``TypeError`` naming ``.long()`` and the ``[N, C]`` probability form, an integer target
    for binary cross-entropy or KL divergence names ``.float()``. With ``output=None`` a module
    that returns a tuple, mapping or dataclass is refused, naming the ``output=`` that reads
    the logits (``output=0`` for a tuple).

    Args:
        module: the model. The step, :func:`sbfunc.predict`,
            :func:`sbfunc.module.eval_outputs` and the per-sample transforms check the dicts
            they are given against it (names and shapes: :func:`sbfunc.module.check_state`).
        criterion: ``criterion(logits, targets)``. An ``nn.Module`` loss must have
            ``reduction='none'``; a function that accepts ``reduction`` (such as
            ``torch.nn.functional.cross_entropy``) is called with ``reduction='none'``.
        input: where the model's arguments sit in the batch (:data:`Inputs`): an int index
            (tuple batches), a str key (dict batches), a callable ``batch -> input``, a tuple of
            str keys passed as keyword arguments of those names, a tuple of ints passed
            positionally, or a mapping ``{keyword: field}``.
        target: where the target sits: an int, a str or a callable, as a single ``input``.
        output: how to read the logits from the module's result (:data:`Output`): ``None``,
            an attribute name or mapping key, an int index, or a callable.
        mode: the module's mode during the call (:data:`Mode`, see above).
        ignore_index: the target label of a token that is not real (torch's and Hugging
            Face's -100; a criterion's own ``ignore_index`` takes precedence); ``None``: every
            target is real.
        attention_mask: the batch field of the attention mask (``[N, L]``, nonzero at real
            positions): a row with no real position is left out of a step before the forward.
            ``"auto"`` (the default): the ``"attention_mask"`` field of a mapping batch that
            has one (Hugging Face's name); ``None``: none.

    Returns:
        A :class:`ModuleLoss`: a :class:`LossFn` that also exposes ``forward`` and
        ``criterion`` separately and ``with_mode(mode)``.

    Raises:
        TypeError: if ``module`` is not an ``nn.Module``, ``criterion`` is not callable, or
            ``input``/``output``/``mode`` have another form. Calls raise ``KeyError`` or
            ``IndexError`` for a field missing from the batch (naming the available ones),
            ``TypeError``/``KeyError`` for an output that is not tensors or lacks ``output``,
            and ``TypeError`` for a target of the wrong dtype (see above).
        ValueError: if an ``nn.Module`` criterion reduces the batch, ``input`` is empty or
            ``mode`` is another str.

    Example:
        >>> model = torch.nn.Linear(3, 2)
        >>> loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy)
        >>> params, buffers = sbfunc.split_module(model)
        >>> loss_fn(params, buffers, (torch.randn(5, 3), torch.tensor([0, 1, 0, 1, 1]))).shape
        torch.Size([5])

        Keyword inputs and a structured output, as for a Hugging Face classifier:

        >>> class Classifier(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.embed = torch.nn.EmbeddingBag(10, 2, mode="sum")
        ...     def forward(self, input_ids, attention_mask):
        ...         return {"logits": self.embed(input_ids, per_sample_weights=attention_mask)}
        >>> model = Classifier()
        >>> loss_fn = sbfunc.per_sample_loss(
        ...     model, torch.nn.functional.cross_entropy,
        ...     input=("input_ids", "attention_mask"), target="labels", output="logits")
        >>> batch = {"input_ids": torch.tensor([[1, 2], [3, 0]]),
        ...          "attention_mask": torch.tensor([[1.0, 1.0], [1.0, 0.0]]),
        ...          "labels": torch.tensor([0, 1]), "text": ["a b", "c"]}
        >>> loss_fn(*sbfunc.split_module(model), batch).shape
        torch.Size([2])

    References:
        Jiang et al. 2019, "Accelerating Deep Learning by Focusing on the Biggest Losers";
        Hugging Face Transformers ``ModelOutput`` (``outputs.logits``).
    """
    return ModuleLoss(
        module,
        criterion,
        input=input,
        target=target,
        output=output,
        mode=mode,
        ignore_index=ignore_index,
        attention_mask=attention_mask,
    )


def _has_tied_tensors(module: nn.Module) -> bool:
    """Whether a parameter or buffer is registered under two names (tied embeddings)."""
    params = list(module.named_parameters(remove_duplicate=False))
    buffers = list(module.named_buffers(remove_duplicate=False))
    return len({id(t) for _, t in params + buffers}) < len(params) + len(buffers)


class ModuleLoss:
    """A :class:`LossFn` built from a module and a criterion, split into its two halves.

    Calling it is ``criterion(forward(params, buffers, batch), batch)``. The halves let the
    training step run the forward, fire ``AFTER_FORWARD``/``BEFORE_LOSS``, then the loss (so
    algorithms can change targets in between, as Composer's events promise). ``forward``
    returns the logits already selected by ``output``, tensors only, so ``torch.func.vjp``
    accepts it. Build it with :func:`per_sample_loss`.

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
        input: Inputs = 0,
        target: Field = 1,
        output: Output = None,
        mode: Mode = "auto",
        ignore_index: int | None = -100,
        attention_mask: Field | None = "auto",
    ) -> None:
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be an nn.Module, got {type(module).__name__}")
        self.module = module
        self.raw_criterion = criterion
        self._criterion = _per_element_criterion(criterion)
        self._target_kind = target_kind(criterion)
        self.tokens = TokenTargets.of(criterion, self._target_kind, ignore_index, attention_mask)
        self.input, self.target = check_inputs(input), target
        self.output, self.mode = check_output(output), check_mode(mode)
        # functional_call unties shared tensors on every call unless told there are none.
        self._tied = _has_tied_tensors(module)

    def with_mode(self, mode: Mode) -> ModuleLoss:
        """The same loss in another mode (e.g. eval-mode scoring of a train loss; the training
        step calls ``with_mode("train")`` on a ``mode="auto"`` loss).

        Args:
            mode: the new mode (:data:`Mode`).

        Returns:
            A new :class:`ModuleLoss`; this one is unchanged.

        Raises:
            TypeError, ValueError: if ``mode`` is not a :data:`Mode`.

        Example:
            >>> mse = torch.nn.functional.mse_loss
            >>> sbfunc.per_sample_loss(torch.nn.Linear(2, 2), mse).with_mode("train").mode
            'train'
        """
        return ModuleLoss(
            self.module,
            self.raw_criterion,
            input=self.input,
            target=self.target,
            output=self.output,
            mode=mode,
            ignore_index=self.tokens.ignore_index,
            attention_mask=self.tokens.attention_mask,
        )

    def forward(self, params: Params, buffers: Params, batch: Any) -> Any:
        """The logits (the module's result read by ``output``) on the batch's inputs, in this
        loss's train/eval mode."""
        args, kwargs = read_inputs(batch, self.input)
        with module_mode(self.module, mode_flag(self.mode)) as module:
            try:
                outputs = functional_call(
                    module, (params, buffers), args, kwargs, tie_weights=self._tied
                )
            except (AttributeError, KeyError, RuntimeError):  # dicts of another model?
                check_state(self, params, buffers)  # raises naming them, if they are
                raise
        return select_output(outputs, self.output)

    def elements(self, outputs: Any, batch: Any) -> torch.Tensor | TokenLosses:
        """The criterion's losses of the logits ``outputs``: :class:`TokenLosses` for a loss
        over tokens (a token criterion, or torch's class criteria on ``[N, T...]`` integer
        targets), else the loss per row or per element, ``[N, ...]``."""
        target = extract(batch, self.target, "target")
        check_target(self._target_kind, outputs, target)
        losses = self._criterion(outputs, target)
        tokens = token_losses_of(losses, target, self.tokens.ignore_index)
        return losses if tokens is None else tokens

    def criterion(self, outputs: Any, batch: Any) -> torch.Tensor:
        """Per-sample losses ``[N]`` of the logits ``outputs`` against the batch's target: the
        mean over each row's real tokens for a loss over tokens (NaN for a row without one),
        else the mean over the trailing dimensions."""
        losses = self.elements(outputs, batch)
        if isinstance(losses, TokenLosses):
            return losses.row_means()
        n = outputs.shape[0] if isinstance(outputs, torch.Tensor) and outputs.dim() > 0 else None
        return reduce_per_sample(losses, n)

    def parameter_names(self) -> frozenset[str]:
        """Every name under which the module holds a parameter (tied names too). Given in
        ``buffers`` (:func:`split_module` puts frozen parameters there), such a tensor is a
        frozen parameter: no forward writes it, so the step neither copies nor synchronises
        it.

        Example:
            >>> ce = torch.nn.functional.cross_entropy
            >>> sorted(sbfunc.per_sample_loss(torch.nn.Linear(2, 2), ce).parameter_names())
            ['bias', 'weight']
        """
        return frozenset(k for k, _ in self.module.named_parameters(remove_duplicate=False))

    def usable_rows(self, batch: Any) -> torch.Tensor | None:
        """``Tensor[N]`` of bools, read from the batch alone (before any forward): the rows
        with a real target token and a real position in the attention mask; ``None`` when
        neither can be known (every row counts)."""
        return self.tokens.usable(batch, self.target)

    def __call__(self, params: Params, buffers: Params, batch: Any) -> torch.Tensor:
        return self.criterion(self.forward(params, buffers, batch), batch)

    def __repr__(self) -> str:
        out = "" if self.output is None else f", output={self.output!r}"
        return (
            f"ModuleLoss({type(self.module).__name__}, input={self.input!r}, "
            f"target={self.target!r}{out}, mode={self.mode!r})"
        )
