"""Per-row signals of the scoring forward beyond the loss: the logits, the penultimate
features (the head's input) and the targets, at fixed shapes, from the same no-grad forward.

A policy names what it reads in ``Policy.needs`` (a subset of :data:`SIGNALS`); Selective
Backprop then scores with :func:`score_signals`, which runs the one forward it runs anyway and
also returns those signals. The features are read by a forward hook on the model's *head* (unless
named, the last ``nn.Linear`` the forward calls, which must return the logits) of a private copy
of the module's structure that shares the module's tensors: the user's module is never changed,
and the hooks, installed before any tracing, compile into the step's graph with
``fullgraph=True``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from sbfunc.batch import Field, batch_device, batch_size, extract
from sbfunc.module import ModuleLoss, reduce_per_sample
from sbfunc.score._downsample import downsample_batch
from sbfunc.score._losses import scoring_precision, unusable_as_nan
from sbfunc.types import LossFn, Params, PerSample

__all__ = [
    "SIGNALS",
    "SignalScorer",
    "Signals",
    "check_needs",
    "check_signals",
    "find_head",
    "score_signals",
]

SIGNALS = ("logits", "features", "targets")
"""The signals a policy can read (``Policy.needs``), besides the per-row score."""

HEAD_FIX = (
    "name the layer whose input is the features and whose output is the logits: pass "
    "SelectiveBackprop(scoring=sbfunc.score.Scoring(head='<name of the layer that outputs the "
    "logits>'))"
)
"""How to name the head, the end of every message about it."""


class Signals(NamedTuple):
    """Per-row signals of the scoring forward; a field is ``None`` when no policy asked for it.

    Attributes:
        logits: ``Tensor[N, C]``, the model's output the loss reads (detached).
        features: ``Tensor[N, D]``, the input of the model's head (the penultimate features,
            flattened per row; detached).
        targets: the batch's targets as the loss reads them (class indices ``Tensor[N]``).

    Example:
        >>> from sbfunc.score import Signals
        >>> Signals(logits=torch.zeros(2, 3)).features is None
        True
    """

    logits: torch.Tensor | None = None
    features: torch.Tensor | None = None
    targets: torch.Tensor | None = None


def check_needs(needs: Iterable[str], name: str = "needs") -> frozenset[str]:
    """Validate the signals a policy reads and return them as a frozenset.

    Raises:
        TypeError: for a str (not a collection of names) or a name that is not a str.
        ValueError: for a name outside :data:`SIGNALS`.

    Example:
        >>> from sbfunc.score import check_needs
        >>> sorted(check_needs(["features", "logits"]))
        ['features', 'logits']
    """
    if isinstance(needs, str) or not isinstance(needs, Iterable):
        raise TypeError(
            f"{name} must be a collection of signal names from {SIGNALS}, got {needs!r}"
        )
    names = frozenset(needs)
    unknown = sorted(str(n) for n in names - set(SIGNALS))
    if unknown:
        raise ValueError(f"{name} may name only {SIGNALS}, got {unknown}")
    return names


def check_signals(signals: Signals | None, needs: frozenset[str], n: int) -> Signals:
    """The ``signals`` a policy that ``needs`` them was given, checked: each named field a
    tensor of ``n`` rows.

    Raises:
        ValueError: for a missing signal (``signals=None`` or a ``None`` field), or one with
            another number of rows.

    Example:
        >>> from sbfunc.score import Signals, check_signals
        >>> check_signals(Signals(logits=torch.zeros(2, 3)), frozenset({"logits"}), 2).logits.shape
        torch.Size([2, 3])
    """
    given = Signals() if signals is None else signals
    for name in sorted(needs):
        value = getattr(given, name)
        if not isinstance(value, torch.Tensor):
            raise ValueError(
                f"this policy reads the signal {name!r}: pass select(..., signals="
                f"sbfunc.score.Signals({name}=...)) (SelectiveBackprop's scoring does)"
            )
        if value.dim() == 0 or value.shape[0] != n:
            raise ValueError(
                f"signals.{name} must have one row per score ({n}), got shape {tuple(value.shape)}"
            )
    return given


def find_head(module: nn.Module, head: str | None = None) -> str | None:
    """The name of ``module``'s head when ``head`` names it (checked), else ``None``: the head
    is then the last ``nn.Linear`` the forward calls, which must return the logits (found by
    :class:`SignalScorer` on its first forward, whatever the order the layers were registered
    in).

    Raises:
        ValueError: when ``head`` names no submodule, or ``head=None`` and ``module`` has no
            ``nn.Linear`` (name the head: ``Scoring(head="fc")``).

    Example:
        >>> nn = torch.nn
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        >>> find_head(model, "2"), find_head(model)
        ('2', None)
    """
    names = dict(module.named_modules())
    if head is not None:
        if not isinstance(head, str) or head not in names or head == "":
            raise ValueError(
                f"head={head!r} names no submodule of {type(module).__name__}; give the name "
                f"of the layer whose input is the penultimate feature, one of {list(names)[1:8]}"
            )
        return head
    if not _linears(module):
        raise ValueError(
            f"no nn.Linear head found in {type(module).__name__}, so the features cannot be "
            f"read; {HEAD_FIX}"
        )
    return None


def _linears(module: nn.Module) -> list[str]:
    return [n for n, m in module.named_modules() if isinstance(m, nn.Linear)]


class _Tap:
    """What the latest hooked call of one scoring forward left: the layer's name, its input
    and its output (only the latest: earlier activations are not kept alive)."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.name: str | None = None
        self.value: torch.Tensor | None = None
        self.output: Any = None

    def hook(self, name: str) -> _TapHook:
        return _TapHook(self, name)


class _TapHook:
    """The forward hook of the layer ``name``: hands its input and output to ``tap``."""

    def __init__(self, tap: _Tap, name: str) -> None:
        self.tap, self.name = tap, name

    def __call__(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        tap = self.tap
        tap.name, tap.value, tap.output = self.name, args[0], output


class SignalScorer:
    """A per-sample loss that also returns :class:`Signals` (built once, reused every step).

    Args:
        loss_fn: a :class:`~sbfunc.module.ModuleLoss` (``sbfunc.per_sample_loss``).
        needs: the signals to return (a subset of :data:`SIGNALS`).
        head: the head's name for the features (``None``: the last ``nn.Linear`` the forward
            calls, which must return the logits; see :func:`find_head`).

    Raises:
        TypeError: for a loss that is not a ``ModuleLoss`` (signals need the model).
        ValueError: as :func:`check_needs` and :func:`find_head`; when called, if the head
            was not called by the forward, or (``head=None``) no ``nn.Linear`` was or the last
            one called does not return the logits: each names ``Scoring(head=...)``.

    Example:
        >>> from sbfunc.score import SignalScorer
        >>> nn = torch.nn
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        >>> loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy)
        >>> scorer = SignalScorer(loss_fn, {"features", "targets"})
        >>> params, buffers = sbfunc.split_module(model)
        >>> losses, sig = scorer(params, buffers, (torch.randn(5, 4), torch.randint(0, 3, (5,))))
        >>> losses.shape, sig.features.shape, sig.logits
        (torch.Size([5]), torch.Size([5, 8]), None)
    """

    def __init__(self, loss_fn: LossFn, needs: Iterable[str], head: str | None = None) -> None:
        if not isinstance(loss_fn, ModuleLoss):
            raise TypeError(
                "a policy that reads logits, features or targets needs the model: score with "
                f"sbfunc.per_sample_loss(model, criterion), got {loss_fn!r:.80}"
            )
        self.needs = check_needs(needs)
        self.loss_fn, self.tap, self.head = loss_fn, _Tap(), head
        self._hooks: dict[str, RemovableHandle] = {}
        if "features" in self.needs:
            self.head = find_head(loss_fn.module, head)
            names = _linears(loss_fn.module) if self.head is None else [self.head]
            self.loss_fn, self._hooks = _tapped(loss_fn, names, self.tap)

    def __call__(
        self, params: Params, buffers: Params, batch: Any
    ) -> tuple[torch.Tensor, Signals]:
        loss_fn, needs = self.loss_fn, self.needs
        assert isinstance(loss_fn, ModuleLoss)
        logits = loss_fn.forward(params, buffers, batch)
        features = self._features(logits) if "features" in needs else None
        n = logits.shape[0]
        losses = unusable_as_nan(
            loss_fn, batch, reduce_per_sample(loss_fn.criterion(logits, batch), n)
        )
        return losses, Signals(
            logits.detach() if "logits" in needs else None,
            features.detach().reshape(n, -1) if features is not None else None,
            extract(batch, loss_fn.target, "target") if "targets" in needs else None,
        )

    def _features(self, logits: Any) -> torch.Tensor:
        """The head's input from the forward that returned ``logits``; with ``head=None``, the
        input of the last ``nn.Linear`` called, which must have returned ``logits`` (every
        ``nn.Linear`` of the private copy stays hooked: the scorer never changes after it is
        built)."""
        tap = self.tap
        name, features, output = tap.name, tap.value, tap.output
        tap.clear()
        if self.head is not None and (name is None or features is None):
            raise ValueError(
                f"the head {self.head!r} was not called by the model's forward; {HEAD_FIX}"
            )
        if name is None or features is None:
            raise ValueError(
                "the model's forward called no nn.Linear, so the features (the head's input) "
                f"cannot be read; {HEAD_FIX}"
            )
        if self.head is None and output is not logits:
            raise ValueError(
                f"the last nn.Linear the model's forward called, {name!r}, does not return the "
                "logits (another layer or operation comes after it), so its input need not be "
                f"the features; {HEAD_FIX}"
            )
        return features


def _tapped(
    loss_fn: ModuleLoss, names: list[str], tap: _Tap
) -> tuple[ModuleLoss, dict[str, RemovableHandle]]:
    """``loss_fn`` over a copy of its module's structure (sharing every tensor) whose layers
    ``names`` hand their input and output to ``tap``, and the hooks' handles."""
    module = loss_fn.module
    shared = {id(t): t for t in [*module.parameters(), *module.buffers()]}
    twin = copy.deepcopy(module, shared)
    hooks = {n: twin.get_submodule(n).register_forward_hook(tap.hook(n)) for n in names}
    tapped = ModuleLoss(
        twin, loss_fn.raw_criterion, input=loss_fn.input, target=loss_fn.target,
        output=loss_fn.output, mode=loss_fn.mode,
    )  # fmt: skip
    return tapped, hooks


def score_signals(
    scorer: SignalScorer,
    params: Params,
    buffers: Params,
    batch: Any,
    *,
    scale_factor: float = 1.0,
    input: Field = 0,
    dtype: torch.dtype | None = None,
    per_sample: PerSample = None,
    rows: int | None = None,
) -> tuple[torch.Tensor, Signals]:
    """Per-sample losses and :class:`Signals` of a whole batch under no-grad: the scoring
    forward of :func:`~sbfunc.score.score_losses` that also returns what ``scorer`` needs.

    The arguments are those of :func:`~sbfunc.score.score_losses` (``rows`` too); the losses
    come back as ``float32`` under ``dtype`` (the logits and features too), every signal
    detached, one row per batch row (fixed shapes). An empty batch runs no forward and returns
    ``Signals()``.

    Example:
        >>> from sbfunc.score import SignalScorer, score_signals
        >>> nn = torch.nn
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        >>> scorer = SignalScorer(sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy),
        ...                       {"logits"})
        >>> params, buffers = sbfunc.split_module(model)
        >>> losses, sig = score_signals(scorer, params, buffers,
        ...                             (torch.randn(5, 4), torch.randint(0, 3, (5,))))
        >>> sig.logits.shape
        torch.Size([5, 3])
    """
    n = batch_size(batch, per_sample=per_sample) if rows is None else rows
    if n == 0:  # nothing to select from: no forward
        return torch.zeros(0, device=batch_device(batch)), Signals()
    scored = downsample_batch(batch, scale_factor, input=input)
    with torch.no_grad(), scoring_precision(params, dtype):
        losses, signals = scorer(params, buffers, scored)
    if losses.shape[0] != n:
        raise ValueError(f"the scoring loss returned {losses.shape[0]} rows for {n}")
    if dtype is None:
        return losses.detach(), signals
    as_float = [None if t is None or not t.is_floating_point() else t.float() for t in signals]
    return losses.float(), Signals(as_float[0], as_float[1], signals.targets)
