"""Record the Linear and Conv calls a loss function makes on the parameters being differentiated.

:class:`LayerRecorder` is a :class:`torch.overrides.TorchFunctionMode`: while the loss function
runs, every ``F.linear`` / ``torch.conv{1,2,3}d`` call whose weight *is* one of the tracked
parameter tensors is recorded (input as a :class:`~sbfunc.per_sample._layers.Contraction`, and
its output), and any other differentiable use of a tracked tensor is noted. A parameter is
*covered* (its per-sample quantities follow from the layer identities) when it is used exactly
once, as the weight or bias of a recorded call, and nowhere else; the rest fall back to
``vmap(grad)``. Train-mode batch normalization is refused: it couples the samples.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import optree
import torch
import torch.nn.functional as F
from torch.autograd.graph import GradientEdge, get_gradient_edge
from torch.overrides import TorchFunctionMode

from sbfunc.per_sample._layers import Contraction, ConvLayer, conv_layer, linear_contraction

__all__ = ["BATCH_NORM_HELP", "LayerCall", "LayerRecorder"]

BATCH_NORM_HELP = (
    "per-sample gradients need samples that do not interact, but batch normalization in "
    "train mode normalizes each sample with statistics of the whole batch (and updates its "
    "running statistics). Fix it with one of: build the loss with "
    "sbfunc.per_sample_loss(..., mode='eval') (eval-mode BatchNorm uses its running "
    "statistics); torch.func.replace_all_batch_norm_modules_(model) (no running statistics: "
    "each sample is then normalized by its own statistics, via vmap over the samples); or "
    "replace BatchNorm by GroupNorm/LayerNorm"
)

_CONV_DIMS: dict[Callable[..., Any], int] = {torch.conv1d: 1, torch.conv2d: 2, torch.conv3d: 3}
_CONV_ARGS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
_CONV_DEFAULTS = {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1}
_BATCH_NORMS = (F.batch_norm, torch.batch_norm)


class LayerCall(NamedTuple):
    """A recorded layer call: tracked weight name, bias name (``None`` if untracked/absent),
    its contraction, the gradient edge of its output (so in-place ops after the layer, such as
    ``ReLU(inplace=True)``, do not change which gradient is read), and the input with its
    version counter when it was recorded.

    Example:
        >>> w = torch.ones(2, 3, requires_grad=True)
        >>> with LayerRecorder({id(w): "w"}, 4) as rec:
        ...     y = torch.nn.functional.linear(torch.ones(4, 3), w)
        >>> call = rec.calls[0]
        >>> call.weight, call.bias, call.contraction.x.shape
        ('w', None, torch.Size([4, 1, 1, 3]))

    References:
        ``torch.autograd.graph.get_gradient_edge``; Dangel et al. 2020, "BackPACK" (module
        hooks that store layer inputs and output gradients).
    """

    weight: str
    bias: str | None
    contraction: Contraction | ConvLayer
    output: GradientEdge
    input: torch.Tensor
    input_version: int


def _bind(args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    bound = dict(_CONV_DEFAULTS)
    bound.update(zip(_CONV_ARGS, args, strict=False))
    bound.update(kwargs)
    return bound


def _expand(value: Any, d: int) -> Any:
    if isinstance(value, str):
        return value
    values = tuple(value) if isinstance(value, Sequence) else (value,)
    return values * d if len(values) == 1 else values


def _batch_norm_mode(func: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> str:
    """``"eval"``, ``"per_sample"`` (train mode without running statistics, as left by
    ``torch.func.replace_all_batch_norm_modules_``) or ``"batch"`` (train mode with them)."""
    # Both take ``training`` 6th; running stats are 2nd/3rd in F.batch_norm, 4th/5th in torch's.
    if not kwargs.get("training", args[5] if len(args) > 5 else False):
        return "eval"
    first = 1 if func is F.batch_norm else 3
    stats = [
        kwargs.get(k, args[i] if len(args) > i else None)
        for i, k in enumerate(("running_mean", "running_var"), start=first)
    ]
    return "per_sample" if all(s is None for s in stats) else "batch"


class LayerRecorder(TorchFunctionMode):
    """Records Linear/Conv calls on tracked parameters while a loss function runs.

    Args:
        tracked: ``{id(tensor): name}`` of the parameters being differentiated.
        n: the batch size; only calls whose input has leading dimension ``n`` are recorded.

    Returns:
        A mode to use as a context manager; after the forward, ``calls`` holds the recorded
        :class:`LayerCall` objects, ``other`` the names used otherwise, :meth:`covered` the
        names whose quantities follow from the layer identities.

    Raises:
        ValueError: (while active) when batch normalization runs in train mode with running
            statistics. Without them (``torch.func.replace_all_batch_norm_modules_``) it sets
            ``per_sample_norm`` and :meth:`covered` is empty: ``vmap`` then normalizes each
            sample by its own statistics, like a loop over samples.

    Example:
        >>> w = torch.ones(2, 3, requires_grad=True)
        >>> with LayerRecorder({id(w): "w"}, 4) as rec:
        ...     y = torch.nn.functional.linear(torch.ones(4, 3), w)
        >>> [call.weight for call in rec.calls], rec.covered()
        (['w'], {'w'})

    References:
        ``torch.overrides.TorchFunctionMode``; Opacus's ghost clipping (per-layer activations
        and backprops of the summed loss).
    """

    def __init__(self, tracked: dict[int, str], n: int) -> None:
        super().__init__()
        self.tracked, self.n = tracked, n
        self.calls: list[LayerCall] = []
        self.other: set[str] = set()
        self.per_sample_norm = False

    def _name(self, t: Any) -> str | None:
        return self.tracked.get(id(t)) if isinstance(t, torch.Tensor) else None

    def _names_in(self, values: Sequence[Any]) -> set[str]:
        """Tracked names among ``values`` and nested lists/tuples (cheap: runs on every op)."""
        names: set[str] = set()
        for v in values:
            if isinstance(v, list | tuple):
                names |= self._names_in(v)
            elif id(v) in self.tracked and isinstance(v, torch.Tensor):
                names.add(self.tracked[id(v)])
        return names

    def _contraction(
        self, func: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]
    ) -> tuple[dict[str, Any], Contraction | ConvLayer] | None:
        bound = _bind(args, kwargs)
        x, weight = bound["input"], bound["weight"]
        if self._name(weight) is None or not isinstance(x, torch.Tensor):
            return None
        if func is F.linear:
            if x.dim() < 2 or x.shape[0] != self.n:
                return None
            return bound, linear_contraction(x, weight)
        d = _CONV_DIMS[func]
        if x.dim() != d + 2 or x.shape[0] != self.n:
            return None
        stride, padding, dilation = (
            _expand(bound[k], d) for k in ("stride", "padding", "dilation")
        )
        return bound, conv_layer(x, weight, stride, padding, dilation, bound["groups"])

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func in _BATCH_NORMS:
            mode = _batch_norm_mode(func, args, kwargs)
            if mode == "batch":
                raise ValueError(BATCH_NORM_HELP)
            self.per_sample_norm |= mode == "per_sample"
        recorded = (
            self._contraction(func, args, kwargs)
            if func is F.linear or func in _CONV_DIMS
            else None
        )
        out = func(*args, **kwargs)
        if recorded is not None:
            bound, contraction = recorded
            x = bound["input"]
            self.calls.append(
                LayerCall(
                    self.tracked[id(bound["weight"])],
                    self._name(bound["bias"]),
                    contraction,
                    get_gradient_edge(out),
                    x,
                    x._version,
                )
            )
            return out
        names = self._names_in((*args, *kwargs.values()))
        if names and any(
            isinstance(r, torch.Tensor) and r.requires_grad for r in optree.tree_leaves(out)
        ):
            self.other.update(names)
        return out

    def covered(self) -> set[str]:
        """Names used exactly once, as a recorded weight or bias, and nowhere else (none when a
        statistics-free train-mode BatchNorm needs every sample run on its own)."""
        if self.per_sample_norm:
            return set()
        uses: dict[str, int] = {}
        for call in self.calls:
            for name in (call.weight, call.bias):
                if name is not None:
                    uses[name] = uses.get(name, 0) + 1
        stale = {c.weight for c in self.calls if c.input._version != c.input_version}
        return {k for k, v in uses.items() if v == 1} - self.other - stale
