"""A module's arguments read from a batch, its logits read from its result, and its mode.

:func:`sbfunc.per_sample_loss` calls a module with the batch fields named by an :data:`Inputs`
(one positional argument, several keyword or positional ones) and reads the logits from its
result with an :data:`Output` (an attribute, key, index or callable), so Hugging Face-style
models (``forward(input_ids, attention_mask)`` returning a ``ModelOutput``) work unchanged,
in the train or eval mode named by a :data:`Mode`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal, NoReturn, Union, cast

import optree
import torch
from torch import nn

from sbfunc.batch import Field, extract

__all__ = [
    "Inputs",
    "Mode",
    "Output",
    "draws_randomness",
    "mode_dependent",
]

Inputs = Union[  # noqa: UP007 (evaluated at runtime on Python 3.10)
    Field, tuple[str, ...], tuple[int, ...], list[str], list[int], Mapping[str, Field]
]
"""Where the model's arguments sit in the batch: one :data:`~sbfunc.batch.Field` (the single
positional argument), a tuple of str field names (passed as keyword arguments of those names,
as Hugging Face models take ``input_ids``, ``attention_mask``), a tuple of int indices (several
positional arguments) or a mapping ``{keyword: field}``."""

Output = Union[None, str, int, Callable[[Any], Any]]  # noqa: UP007
"""How the logits are read from the module's output: ``None`` (the output itself), an attribute
name or mapping key (``"logits"`` of a Hugging Face ``ModelOutput``), an index (``0`` of a
``(logits, hidden)`` tuple) or a callable ``output -> logits``."""

Mode = Literal["auto", "train", "eval", "module"]
"""The module's mode while a per-sample loss runs it: ``"train"``, ``"eval"``, ``"module"``
(the module's own mode at call time, left as it is) or ``"auto"`` (eval when the loss is
called directly, train inside the training step)."""

_MODES = ("auto", "train", "eval", "module")


def check_mode(mode: object) -> Mode:
    """``mode`` if it is a :data:`Mode`.

    Raises:
        TypeError: if ``mode`` is not a str (0.3's ``train=True``/``False``/``None`` are
            ``mode="train"``/``"eval"``/``"module"``).
        ValueError: if it is another str.

    Example:
        >>> sbfunc.module._io.check_mode("Eval")
        Traceback (most recent call last):
        ...
        ValueError: mode must be 'auto', 'train', 'eval' or 'module', got 'Eval'
    """
    if isinstance(mode, str) and mode in _MODES:
        return cast(Mode, mode)
    message = f"mode must be 'auto', 'train', 'eval' or 'module', got {mode!r}"
    if isinstance(mode, str):
        raise ValueError(message)
    raise TypeError(message + " (train=True/False/None are mode='train'/'eval'/'module')")


def mode_flag(mode: Mode) -> bool | None:
    """The ``nn.Module.train`` flag of a direct call in ``mode`` (``"auto"`` is eval), or
    ``None`` to leave the module's mode as it is (:func:`module_mode`)."""
    return {"train": True, "module": None}.get(mode, False)


def check_inputs(input: Inputs) -> Inputs:
    """Validate an :data:`Inputs` (a list of names becomes a tuple, a mapping a dict).

    Raises:
        TypeError: for another form, a sequence mixing names and indices, or a mapping whose
            values are not single fields.
        ValueError: for an empty sequence or mapping, or non-str keyword names.

    Example:
        >>> check_inputs(["input_ids", "attention_mask"])
        ('input_ids', 'attention_mask')

    References:
        Hugging Face Transformers model signatures (``input_ids``, ``attention_mask``, ...).
    """
    if isinstance(input, bool):
        raise TypeError("input must be an int, str, callable, tuple of str/int or a mapping")
    if isinstance(input, int | str) or callable(input):
        return input
    if isinstance(input, Mapping):
        if not input or not all(isinstance(k, str) for k in input):
            raise ValueError(f"input as a mapping needs str keyword names, got {dict(input)!r}")
        for field in input.values():
            if isinstance(field, tuple | list | Mapping):
                raise TypeError(f"input mapping values must be single fields, got {field!r}")
            check_inputs(field)
        return dict(input)
    if isinstance(input, tuple | list):
        if not input:
            raise ValueError("input must name at least one field, got an empty sequence")
        if all(isinstance(f, str) for f in input) or all(
            isinstance(f, int) and not isinstance(f, bool) for f in input
        ):
            return tuple(input)  # type: ignore[return-value]
        raise TypeError(
            f"input as a sequence must hold only str field names (keyword arguments) or only "
            f"int indices (positional arguments), got {input!r}"
        )
    raise TypeError(
        "input must be an int, str, callable, tuple of str/int or a mapping {keyword: field}, "
        f"got {type(input).__name__}"
    )


def check_output(output: Output) -> Output:
    """Validate an :data:`Output` selector and return it.

    Raises:
        TypeError: for anything but ``None``, a str, an int or a callable.

    Example:
        >>> check_output("logits")
        'logits'

    References:
        Hugging Face Transformers ``ModelOutput``.
    """
    if output is None or callable(output):
        return output
    if isinstance(output, str) or (isinstance(output, int) and not isinstance(output, bool)):
        return output
    raise TypeError(
        f"output must be None, an attribute/key name, an int index or a callable, got {output!r}"
    )


def _structure(value: Any) -> str:
    """What a module returned, for error messages: its type and fields."""
    name = type(value).__name__
    name = ("an " if name[:1].lower() in "aeiou" else "a ") + name
    if isinstance(value, Mapping):
        return f"{name} with keys {[str(k) for k in value]}"
    if isinstance(value, tuple | list):
        kinds = ", ".join(type(v).__name__ for v in value)
        return f"{name} of {len(value)} ({kinds})"
    fields = [k for k in getattr(value, "__dict__", {}) if not k.startswith("_")]
    return f"{name} with attributes {sorted(fields)}" if fields else name


def _suggest(value: Any) -> str:
    """The ``output=`` that most likely reads the logits from ``value``."""
    if isinstance(value, tuple | list):
        return "output=0 (the first element)"
    keys = list(value) if isinstance(value, Mapping) else list(getattr(value, "__dict__", {}))
    names = [str(k) for k in keys if not str(k).startswith("_")]
    pick = "logits" if "logits" in names else (names[0] if names else "logits")
    return f"output={pick!r} (an attribute or key)"


def _check_tensors(value: Any, what: str) -> Any:
    if isinstance(value, torch.Tensor):
        return value
    leaves = optree.tree_leaves(value, none_is_leaf=True)
    if leaves and all(isinstance(leaf, torch.Tensor) for leaf in leaves):
        return value
    raise TypeError(
        f"{what} is {_structure(value)}, but the training step's torch.func transforms need "
        "tensors only; pass output= to per_sample_loss to select the logits, e.g. "
        "output='logits' (an attribute or key), output=0 (an index) or a callable"
    )


def _refuse_structured(outputs: Any) -> NoReturn:
    """With ``output=None`` the module must return the logits tensor itself: a tuple, list,
    mapping or dataclass would reach the criterion whole (cross-entropy then fails on a
    tuple)."""
    raise TypeError(
        f"the module's output is {_structure(outputs)}, not the logits tensor the criterion "
        f"needs; pass {_suggest(outputs)} to per_sample_loss to read the logits (output=0 "
        "for an index, or output=lambda out: out to give the whole result to the criterion)"
    )


def select_output(outputs: Any, output: Output) -> Any:
    """Read the logits from a module's result: ``outputs`` itself (``output=None``), an
    attribute or key, an index, or ``output(outputs)``. With ``output=None`` the result must
    be a tensor (a tuple, mapping or dataclass is refused, naming the ``output=`` that reads
    its logits); a selection must be tensors only.

    Args:
        outputs: what the module returned.
        output: an :data:`Output` selector.

    Returns:
        The selected tensor (or pytree of tensors).

    Raises:
        KeyError: if the key/attribute is missing (the message lists what there is).
        IndexError: if the index is out of range.
        TypeError: if ``output=None`` and the result is not a tensor, or the selection is not
            tensors only.
        ValueError: if the selection is a 0-d tensor (a loss reduced over the batch, such as
            a Hugging Face model's ``.loss``), naming ``output='logits'``.

    Example:
        >>> select_output((torch.ones(2), None), 0)
        tensor([1., 1.])
        >>> select_output({"logits": torch.ones(1)}, "loss")
        Traceback (most recent call last):
        ...
        KeyError: "output='loss' is not in the module's output, a dict with keys ['logits']"

    References:
        Hugging Face Transformers ``ModelOutput`` (attribute, key and index access).
    """
    if output is None:
        if isinstance(outputs, torch.Tensor) and outputs.dim() == 0:
            raise ValueError(_REDUCED.format(output))
        if isinstance(outputs, torch.Tensor):
            return outputs
        _refuse_structured(outputs)
    if callable(output):
        value = output(outputs)
    elif isinstance(output, str):
        if isinstance(outputs, Mapping) and output in outputs:
            value = outputs[output]
        elif not isinstance(outputs, Mapping) and hasattr(outputs, output):
            value = getattr(outputs, output)
        else:
            raise KeyError(
                f"output={output!r} is not in the module's output, {_structure(outputs)}"
            )
    else:
        try:
            value = outputs[output]
        except (IndexError, KeyError, TypeError) as err:
            raise IndexError(
                f"output={output} cannot index the module's output, {_structure(outputs)}"
            ) from err
    if isinstance(value, torch.Tensor):  # no message to build (compiled, a tensor has no __dict__)
        if value.dim() == 0:
            raise ValueError(_REDUCED.format(output))
        return value
    return _check_tensors(value, f"output={output!r} selected {_structure(value)}; it")


_REDUCED = (
    "output={0!r} selected a 0-d tensor: a loss already averaged over the batch (such as a "
    "Hugging Face model's .loss), where per-sample losses need the logits, one row per sample. "
    "Read the logits with output='logits' and pass a per-token criterion such as "
    "sbfunc.module.next_token_cross_entropy"
)


def read_inputs(batch: Any, input: Inputs) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The module's ``(args, kwargs)`` read from the batch by a checked :data:`Inputs`.

    Raises:
        KeyError, IndexError, TypeError: for a field the batch lacks (see
            :func:`sbfunc.batch.extract`: the message lists the available keys).

    Example:
        >>> read_inputs({"ids": 1, "mask": 2, "y": 3}, ("ids", "mask"))
        ((), {'ids': 1, 'mask': 2})
        >>> read_inputs((1, 2, 3), (0, 1))
        ((1, 2), {})

    References:
        PyTorch ``torch.func.functional_call(module, tensors, args, kwargs)``.
    """
    if isinstance(input, Mapping):
        return (), {k: extract(batch, f, "input") for k, f in input.items()}
    if isinstance(input, tuple):
        if isinstance(input[0], str):
            return (), {k: extract(batch, k, "input") for k in input}
        return tuple(extract(batch, i, "input") for i in input), {}
    return (extract(batch, input, "input"),), {}  # type: ignore[arg-type]


@contextmanager
def module_mode(module: nn.Module, train: bool | None) -> Iterator[nn.Module]:
    """Run a block with ``module`` in train (``True``) or eval (``False``) mode, then restore
    every submodule's own mode; ``None`` (or the mode it is already in) changes nothing.

    Args:
        module: the module.
        train: the mode for the block, or ``None``.

    Returns:
        A context manager yielding ``module``.

    Example:
        >>> from sbfunc.module import module_mode
        >>> net = torch.nn.Sequential(torch.nn.Dropout(), torch.nn.BatchNorm1d(2).eval())
        >>> with module_mode(net, False):
        ...     net.training, net[0].training
        (False, False)
        >>> net.training, net[0].training, net[1].training
        (True, True, False)

    References:
        PyTorch ``nn.Module.train`` / ``eval``; MosaicML Composer ``select_using_loss`` (which
        scores in the model's current mode).
    """
    if train is None or train == module.training:
        yield module
        return
    saved = [(m, m.training) for m in module.modules()]
    module.train(train)
    try:
        yield module
    finally:
        for m, mode in saved:
            m.training = mode


_RANDOM_LAYERS: tuple[type[nn.Module], ...] = (
    nn.modules.dropout._DropoutNd,
    nn.MultiheadAttention,
)
_MODE_LAYERS: tuple[type[nn.Module], ...] = (
    *_RANDOM_LAYERS,
    nn.modules.batchnorm._BatchNorm,
    nn.modules.instancenorm._InstanceNorm,
)


def draws_randomness(module: nn.Module) -> bool:
    """Whether ``module`` has layers that draw random numbers in training mode (dropout with
    ``p > 0``, multi-head attention with a dropout, and any layer that declares the class
    attribute ``random_forward = True``, such as stochastic depth's branches). A dropout of 0
    draws nothing (a model built with dropout layers and ``dropout=0``, as most language
    models are for fine-tuning), so the step runs it without keyed randomness.

    Example:
        >>> sbfunc.module.draws_randomness(torch.nn.Sequential(torch.nn.Dropout(0.1)))
        True
        >>> sbfunc.module.draws_randomness(torch.nn.Sequential(torch.nn.Dropout(0.0)))
        False

    References:
        PyTorch ``nn.Dropout``, ``nn.MultiheadAttention``.
    """
    return any(_draws(m) for m in module.modules())


def _draws(layer: nn.Module) -> bool:
    if getattr(layer, "random_forward", False):
        return True
    if isinstance(layer, nn.modules.dropout._DropoutNd):
        return layer.p > 0
    if isinstance(layer, nn.MultiheadAttention):
        return layer.dropout > 0
    return False


def mode_dependent(module: nn.Module) -> bool:
    """Whether ``module`` computes differently in training and evaluation mode (dropout,
    batch and instance normalization, multi-head attention): its eval-mode scores then differ
    from its training losses. Custom layers that read ``self.training`` are not detected.

    Example:
        >>> sbfunc.module.mode_dependent(torch.nn.Linear(2, 2))
        False
        >>> sbfunc.module.mode_dependent(torch.nn.BatchNorm1d(2))
        True

    References:
        PyTorch ``nn.Module.train`` / ``eval``.
    """
    return any(isinstance(m, _MODE_LAYERS) for m in module.modules())
