"""Early checks of what a user passes as a loss: the loss function itself, its targets, and
the parameters and buffers given with it.

A module passed where a per-sample loss is expected, or a float target given to
cross-entropy, fails deep inside the first step with a message about positional arguments or
dtypes. These checks refuse them where they are given (:func:`check_loss_fn`, at construction)
or on the first batch (:func:`check_target`, from tensor metadata only: no host sync, nothing
for ``torch.compile`` to recompile), with a message that names the fix. Parameters of another
model would train nothing (``functional_call`` ignores names the module lacks and uses its own
tensors for the missing ones): :func:`check_state` compares names and shapes on the host.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import weakref
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from sbfunc.validation import check_callable, describe

__all__ = ["TargetKind", "accepts_reduction", "check_loss_fn", "check_target", "target_kind"]

T = TypeVar("T")

TargetKind = Literal["classes", "float"] | None
"""What a criterion needs as target: ``"classes"`` (integer class indices, or probabilities of
the logits' shape), ``"float"`` (floating-point values) or ``None`` (not known)."""

_PER_SAMPLE_FIX = (
    "wrap the model and its criterion in a per-sample loss: "
    "sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy)"
)


_ARITY: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
"""Verdicts of :func:`_positional_arity_ok` by function: ``score_losses`` checks its loss on
every call, and ``inspect.signature`` costs tens of microseconds (a fifth of an eager
Selective Backprop step's scoring on a small model)."""


def _positional_arity_ok(fn: Callable[..., Any]) -> bool:
    """Whether ``fn(params, buffers, batch)`` binds (``True`` when the signature is unknown)."""
    try:
        return _ARITY[fn]
    except (KeyError, TypeError):  # not seen yet, or neither hashable nor weakly referenceable
        pass
    try:
        inspect.signature(fn).bind(None, None, None)
        ok = True
    except TypeError:
        ok = False
    except ValueError:  # builtins without a signature
        ok = True
    with contextlib.suppress(TypeError):
        _ARITY[fn] = ok
    return ok


def check_loss_fn(loss_fn: T, name: str = "loss_fn") -> T:
    """Validate a per-sample loss function ``loss_fn(params, buffers, batch) -> Tensor[N]``
    where it is given (at construction), and return it.

    Refused: a non-callable; an ``nn.Module`` (a model or an ``nn.CrossEntropyLoss`` is not a
    function of ``(params, buffers, batch)``); a criterion from ``torch.nn.functional`` (it
    takes ``(logits, targets)``); a function whose signature cannot take three positional
    arguments. Each message names :func:`sbfunc.per_sample_loss`, which builds the right
    function from a model and a criterion.

    Args:
        loss_fn: the value given as the loss function.
        name: the argument's name, for the message.

    Returns:
        ``loss_fn`` unchanged.

    Raises:
        TypeError: for any of the refused values above.

    Example:
        >>> from sbfunc.module import check_loss_fn
        >>> check_loss_fn(torch.nn.Linear(2, 2))
        Traceback (most recent call last):
        ...
        TypeError: loss_fn must be a per-sample loss function ..., got the module Linear; ...
    """
    if torch.compiler.is_compiling():  # checked eagerly where it was given: nothing to trace
        return loss_fn
    expected = f"{name} must be a per-sample loss function (params, buffers, batch) -> Tensor[N]"
    if isinstance(loss_fn, nn.Module):
        raise TypeError(f"{expected}, got the module {type(loss_fn).__name__}; {_PER_SAMPLE_FIX}")
    check_callable(loss_fn, name, fix=_PER_SAMPLE_FIX)
    raw = getattr(loss_fn, "func", loss_fn)  # functools.partial
    if getattr(raw, "__module__", None) == F.__name__:
        raise TypeError(
            f"{expected}, got the criterion {F.__name__}.{getattr(raw, '__name__', raw)} "
            f"(a function of (logits, targets)); {_PER_SAMPLE_FIX}"
        )
    if not _positional_arity_ok(loss_fn):  # type: ignore[arg-type]  # callable, checked above
        raise TypeError(
            f"{expected}, got {describe(loss_fn)}, which cannot take the three positional "
            f"arguments (params, buffers, batch); {_PER_SAMPLE_FIX}"
        )
    return loss_fn


_CLASS_CRITERIA = (F.cross_entropy, F.nll_loss, nn.CrossEntropyLoss, nn.NLLLoss)
_FLOAT_CRITERIA = (
    F.binary_cross_entropy,
    F.binary_cross_entropy_with_logits,
    F.kl_div,
    nn.BCELoss,
    nn.BCEWithLogitsLoss,
    nn.KLDivLoss,
)


def _is(criterion: Any, known: tuple[Any, ...]) -> bool:
    return any(criterion is k or (isinstance(k, type) and isinstance(criterion, k)) for k in known)


def target_kind(criterion: Callable[..., torch.Tensor]) -> TargetKind:
    """The target a criterion needs: ``"classes"`` for cross-entropy and NLL (function,
    module or ``functools.partial`` of them), ``"float"`` for binary cross-entropy and KL
    divergence, ``None`` for any other criterion (its target is not checked).

    Args:
        criterion: the criterion given to :func:`sbfunc.per_sample_loss`.

    Returns:
        A :data:`TargetKind`.

    Example:
        >>> from sbfunc.module import target_kind
        >>> target_kind(torch.nn.functional.cross_entropy), target_kind(torch.nn.MSELoss())
        ('classes', None)
    """
    raw = criterion.func if isinstance(criterion, functools.partial) else criterion
    if _is(raw, _CLASS_CRITERIA):
        return "classes"
    if _is(raw, _FLOAT_CRITERIA):
        return "float"
    return None


def check_target(kind: TargetKind, outputs: Any, target: Any) -> None:
    """Refuse a target the criterion cannot take, from dtypes and shapes only (no host sync;
    under ``torch.compile`` the check runs while tracing).

    * ``"classes"``: a target with one dimension fewer than the logits (class indices) must
      be int64 (or uint8); a float target of that shape is refused, naming ``.long()`` and
      the probability form ``[N, C]`` that cross-entropy also accepts. Logits with the
      classes last (``[N, L, V]``, a language model's) against ``[N, L]`` labels are
      refused, naming :data:`sbfunc.module.next_token_cross_entropy`.
    * ``"float"``: an integer or bool target is refused, naming ``.float()``.

    Args:
        kind: the criterion's :data:`TargetKind` (``None`` checks nothing).
        outputs: the logits.
        target: the target read from the batch.

    Raises:
        TypeError: for a target of the wrong dtype, with the fix.
        ValueError: for class-last logits, with the fix.

    Example:
        >>> from sbfunc.module import check_target
        >>> check_target("classes", torch.zeros(4, 3), torch.zeros(4))
        Traceback (most recent call last):
        ...
        TypeError: target must be int64 class indices ...; convert it with .long(), ...
    """
    if kind is None or not isinstance(target, torch.Tensor):
        return
    if kind == "float":
        if not (target.is_floating_point() or target.is_complex()):
            raise TypeError(
                "target must be floating point for this criterion, got "
                f"{describe(target)}; convert it with .float()"
            )
        return
    if not isinstance(outputs, torch.Tensor) or target.dim() != outputs.dim() - 1:
        return  # probabilities (the logits' shape) or a shape torch reports itself
    if _classes_last(outputs, target):
        raise ValueError(_CLASSES_LAST.format(tuple(outputs.shape), tuple(target.shape)))
    if target.dtype not in (torch.int64, torch.uint8):
        raise TypeError(
            "target must be int64 class indices for this criterion, got "
            f"{describe(target)}; convert it with .long(), or pass class probabilities of "
            f"the logits' shape {tuple(outputs.shape)}"
        )


_CLASSES_LAST = (
    "the logits {0} have the classes last, as a language model's [N, L, vocab] logits do, but "
    "this criterion (torch's cross-entropy or NLL) takes them in dimension 1, [N, C, L], so "
    "labels {1} do not fit it. Use sbfunc.module.next_token_cross_entropy (a causal LM: Hugging "
    "Face's shift, -100 ignored) or sbfunc.module.token_cross_entropy (one label per position) "
    "as the criterion; a Hugging Face model also needs output='logits'"
)


def _classes_last(outputs: torch.Tensor, target: torch.Tensor) -> bool:
    """Whether ``[N, L..., V]`` logits meet ``[N, L...]`` labels, which torch's class
    criteria refuse (they want ``[N, V, L...]``)."""
    channels_first = (outputs.shape[0], *outputs.shape[2:])
    return (
        outputs.dim() >= 3
        and tuple(target.shape) == tuple(outputs.shape[:-1])
        and tuple(target.shape) != channels_first
    )


def accepts_reduction(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` takes a ``reduction=`` keyword (itself or through ``**kwargs``), as the
    criteria of ``torch.nn.functional`` do; ``False`` when its signature cannot be read.

    Example:
        >>> sbfunc.module.accepts_reduction(torch.nn.functional.cross_entropy)
        True
    """
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature
        return False
    return "reduction" in sig.parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()
    )
