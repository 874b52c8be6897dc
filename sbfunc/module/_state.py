"""Check the parameter and buffer dicts a user passes against the module behind a loss."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from sbfunc.validation import describe

__all__ = ["check_state"]


_SHOWN = 6
"""How many names (or shape mismatches) a message lists before ``... N more``."""


def _listed(items: list[str], brackets: str = "[]") -> str:
    more = f", ... {len(items) - _SHOWN} more" if len(items) > _SHOWN else ""
    return brackets[0] + ", ".join(items[:_SHOWN]) + more + brackets[1]


def _module_behind(source: Any) -> nn.Module | None:
    """The module ``source`` runs: itself, the ``module`` a loss carries (a ``ModuleLoss``),
    or ``None``."""
    if isinstance(source, nn.Module):
        return source
    module = getattr(source, "module", None)
    return module if isinstance(module, nn.Module) else None


def _given(params: Any, buffers: Any) -> dict[str, tuple[str, torch.Tensor]]:
    """``{name: (dict name, tensor)}`` of both dicts, their types checked."""
    given: dict[str, tuple[str, torch.Tensor]] = {}
    for arg, d in (("params", params), ("buffers", buffers)):
        if not isinstance(d, dict):
            raise TypeError(
                f"{arg} must be a dict of name -> tensor (sbfunc.split_module), got {describe(d)}"
            )
        for k, v in d.items():
            if not isinstance(k, str):
                raise TypeError(f"{arg} must be keyed by parameter names (str), got {k!r}")
            if not isinstance(v, torch.Tensor):
                raise TypeError(
                    f"{arg} must be a dict of name -> tensor: {arg}[{k!r}] must be a tensor, "
                    f"got {describe(v)}"
                )
            given.setdefault(k, (arg, v))
    return given


def _expected(module: nn.Module) -> tuple[dict[str, tuple[str, torch.Tensor]], set[str]]:
    """The module's tensors ``{name: (kind, tensor)}`` under every name (tied ones too) and
    the names of its non-persistent buffers (derived constants, not state), in one walk
    (``named_parameters`` and ``named_buffers`` would walk the modules twice more)."""
    tensors: dict[str, tuple[str, torch.Tensor]] = {}
    optional: set[str] = set()
    for prefix, m in module.named_modules(remove_duplicate=False):
        dot = f"{prefix}." if prefix else ""
        for k, t in m._parameters.items():
            if t is not None:
                tensors.setdefault(dot + k, ("params", t))
        for k, t in m._buffers.items():
            if t is not None:
                tensors.setdefault(dot + k, ("buffers", t))
                if k in m._non_persistent_buffers_set:
                    optional.add(dot + k)
    return tensors, optional


def _differences(
    module: nn.Module, given: dict[str, tuple[str, torch.Tensor]]
) -> tuple[list[str], list[str], list[str], set[str]]:
    """``(missing, unexpected, mismatched, kinds)``: names and shapes against the module."""
    expected, optional = _expected(module)
    missing, unexpected, mismatched, kinds = [], [], [], set()
    absent = expected.keys() - given.keys() - optional
    if absent:  # a tied tensor may be given under any of its names
        present = {id(expected[k][1]) for k in (expected.keys() & given.keys()) | optional}
        for name, (kind, t) in expected.items():
            if name in absent and id(t) not in present:
                present.add(id(t))
                missing.append(repr(name))
                kinds.add(kind)
    for name, (arg, t) in given.items():
        want = expected.get(name)
        if want is None:
            unexpected.append(repr(name))
            kinds.add(arg)
        elif not nn.parameter.is_lazy(want[1]) and t.shape != want[1].shape:
            mismatched.append(f"{name!r}: {tuple(t.shape)} given, {tuple(want[1].shape)} expected")
            kinds.add(arg)
    return missing, unexpected, mismatched, kinds


def check_state(
    source: Any, params: Any, buffers: Any, *, name: str = "loss_fn", training: bool = False
) -> None:
    """Refuse ``params`` and ``buffers`` that do not belong to the module behind a loss (or
    to a module): other names, names missing, or other shapes.

    ``functional_call`` silently ignores names the module lacks and uses the module's own
    tensors for the names it is not given, so the parameters of another model train nothing
    (and :func:`sbfunc.predict` returns the module's own outputs), while parameters of the
    same names and other shapes run another network. This compares names and shapes on the
    host (no device sync, nothing traced: under ``torch.compile`` it checks nothing). Allowed:
    other dtypes (mixed precision) and devices; a tied tensor under any of its names; a
    parameter passed in ``buffers`` (held constant) and the other way round; a non-persistent
    buffer left out (not state: the module's own is used). A plain loss function with no module
    behind it (no ``module`` attribute, as a :class:`~sbfunc.module.ModuleLoss` has) is not
    checked.

    Args:
        source: a :class:`~sbfunc.module.ModuleLoss` (its ``module`` is compared), an
            ``nn.Module``, or any other loss function (nothing is checked).
        params: the parameter dict given with it.
        buffers: the buffer dict given with it.
        name: what ``source`` is called in the message (``"module"`` for a module).
        training: ``params`` are to be trained (``step.init``): a parameter frozen in the
            module (``requires_grad=False``) among them is refused too, since training it would
            silently change what the user froze (:func:`sbfunc.split_module` puts frozen
            parameters in ``buffers``).

    Raises:
        TypeError: if ``params`` or ``buffers`` is not a dict of name -> tensor (checked for
            any ``source``).
        ValueError: naming the missing, unexpected and mismatched-shape entries (at most six
            of each, then how many more) and the fix, :func:`sbfunc.split_module`; with
            ``training``, naming the frozen parameters given in ``params``.

    Example:
        >>> from sbfunc.module import check_state
        >>> loss_fn = sbfunc.per_sample_loss(torch.nn.Linear(2, 3), torch.nn.functional.mse_loss)
        >>> check_state(loss_fn, {"weight": torch.zeros(3, 2), "bias": torch.zeros(2)}, {})
        Traceback (most recent call last):
        ...
        ValueError: params do not match the module behind loss_fn (Linear): shape mismatch
        {'bias': (2,) given, (3,) expected}; build them from this module with ...
    """
    if torch.compiler.is_compiling():
        return
    given = _given(params, buffers)  # the types, whatever the loss
    module = _module_behind(source)
    if module is None:
        return
    missing, unexpected, mismatched, kinds = _differences(module, given)
    if training and not (missing or unexpected or mismatched):
        _refuse_frozen(module, params, name)
    if not (missing or unexpected or mismatched):
        return
    parts = [f"missing {_listed(missing)}"] if missing else []
    parts += [f"unexpected {_listed(unexpected)}"] if unexpected else []
    if mismatched:
        parts.append(f"shape mismatch {_listed(mismatched, '{}')}")
    what = " and ".join(k for k in ("params", "buffers") if k in kinds)
    behind = name if isinstance(source, nn.Module) else f"the module behind {name}"
    raise ValueError(
        f"{what} do not match {behind} ({type(module).__name__}): {', '.join(parts)}; build "
        "them from this module with sbfunc.split_module(module) (other dtypes are fine)"
    )


def _refuse_frozen(module: nn.Module, params: dict[str, torch.Tensor], name: str) -> None:
    """Raise when ``params`` holds a parameter the module has frozen (``requires_grad``
    false): it would be trained."""
    frozen = [
        repr(k)
        for k, p in module.named_parameters(remove_duplicate=False)
        if k in params and not p.requires_grad
    ]
    if frozen:
        raise ValueError(
            f"params hold {len(frozen)} parameters frozen in the module behind {name} "
            f"(requires_grad=False): {_listed(frozen)}; a step trains every entry of params, so "
            "pass frozen parameters in buffers (sbfunc.split_module(module) does), or call "
            "requires_grad_(True) on them to train them"
        )
