"""Layer freezing: stop training the earliest layers, progressively, as training advances."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from sbfunc.engine import Algorithm, Context, Event
from sbfunc.types import Params
from sbfunc.validation import check_real

__all__ = ["LayerFreezing", "freezable_layers", "freeze_depth", "freeze_fraction"]


def freezable_layers(module: nn.Module) -> list[str]:
    """The layers of ``module`` in order: the prefixes of its leaf modules that hold
    parameters, depth first (as ``named_modules`` names them; ``""`` for a leaf root).

    Example:
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(),
        ...                           torch.nn.Sequential(torch.nn.Linear(2, 1)))
        >>> freezable_layers(net)
        ['0', '2.0']

    References:
        MosaicML Composer ``layer_freezing._get_layers``.
    """
    return [
        name
        for name, m in module.named_modules()
        if not any(True for _ in m.children()) and any(True for _ in m.parameters())
    ]


def freeze_fraction(elapsed: float, freeze_start: float, freeze_level: float) -> float:
    """The fraction of layers frozen after a fraction ``elapsed`` of training: 0 until
    ``freeze_start``, then growing linearly to ``freeze_level`` at the end of training.

    Example:
        >>> [freeze_fraction(t, 0.5, 1.0) for t in (0.25, 0.5, 0.75, 1.0)]
        [0.0, 0.0, 0.5, 1.0]

    References:
        MosaicML Composer ``layer_freezing._freeze_schedule``.
    """
    if elapsed <= freeze_start:
        return 0.0
    return freeze_level * (elapsed - freeze_start) / (1.0 - freeze_start)


def freeze_depth(num_layers: int, fraction: float) -> int:
    """How many of ``num_layers`` layers a frozen ``fraction`` freezes (never the last one).

    Example:
        >>> freeze_depth(5, 1.0), freeze_depth(5, 0.6)
        (4, 2)

    References:
        MosaicML Composer ``freeze_layers`` (``int(fraction * (num_layers - 1))``).
    """
    return int(fraction * max(num_layers - 1, 0))


def _frozen(params: Params, prefixes: Sequence[str]) -> list[str]:
    dotted = tuple(p + "." for p in prefixes if p)
    everything = "" in prefixes
    return [k for k in params if everything or k in prefixes or k.startswith(dotted)]


class LayerFreezing(Algorithm):
    """Freeze the earliest layers progressively: their parameters stop changing.

    The host decides in ``match``, from ``state.time.elapsed``, how many of ``layers`` are
    frozen (:func:`freeze_fraction`, :func:`freeze_depth`; the decision is that number, so a
    compiled step compiles one graph per depth). On ``AFTER_BACKWARD`` the frozen parameters'
    gradients become zeros (what later algorithms and the finiteness check see) and their
    current values wait in the per-batch scratch; on ``AFTER_TRAIN_BATCH`` they are put back
    after the update, so momentum and weight decay cannot move them either (Composer removes
    them from the optimizer). Freezing is monotone because ``elapsed`` only grows.

    Differences from Composer: the depth follows ``elapsed`` at every step (Composer
    recomputes it at each epoch end), and there is no speed-up, as the step still
    differentiates every parameter (one function, one backward; a frozen set that changes
    would mean another graph per set anyway).

    Args:
        freeze_start: fraction of training before freezing begins, in ``[0, 1)``.
        freeze_level: fraction of the layers frozen at the end of training, in ``[0, 1]``.
        layers: the layers in freezing order, as parameter-name prefixes (module names), or
            the model (:func:`freezable_layers`). The last layer is never frozen.

    Example:
        >>> from sbfunc.algorithms import LayerFreezing
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
        >>> freeze = LayerFreezing(freeze_start=0.0, freeze_level=1.0, layers=net)
        >>> params, _ = sbfunc.split_module(net)
        >>> grads = {k: torch.ones_like(v) for k, v in params.items()}
        >>> ctx = sbfunc.Context(sbfunc.random.key(0), params, grads=grads,
        ...                      time=sbfunc.Time(elapsed=1.0))
        >>> depth = freeze.match(sbfunc.Event.AFTER_BACKWARD, ctx); depth
        1
        >>> out = freeze.apply(sbfunc.Event.AFTER_BACKWARD, ctx.replace(matched=depth))
        >>> {k: int(g.abs().sum()) for k, g in out.grads.items()}
        {'0.weight': 0, '0.bias': 0, '1.weight': 2, '1.bias': 1}

    References:
        Brock et al. 2017, "FreezeOut: Accelerate Training by Progressively Freezing Layers";
        Raghu et al. 2017 (SVCCA, "freeze training"); MosaicML Composer ``LayerFreezing``.
    """

    uses_key = False  # deterministic: the engine derives no key for it

    def __init__(
        self,
        freeze_start: float = 0.5,
        freeze_level: float = 1.0,
        *,
        layers: nn.Module | Sequence[str],
    ) -> None:
        self.freeze_start = check_real(
            freeze_start, "freeze_start", low=0.0, high=1.0, open_high=True
        )
        self.freeze_level = check_real(freeze_level, "freeze_level", low=0.0, high=1.0)
        if isinstance(layers, nn.Module):
            layers = freezable_layers(layers)
        elif isinstance(layers, str) or not all(isinstance(x, str) for x in layers):
            raise TypeError(
                f"layers must be an nn.Module or a sequence of module names, got {layers!r}"
            )
        self.layers = tuple(layers)

    def depth(self, elapsed: float) -> int:
        """How many layers are frozen after a fraction ``elapsed`` of training."""
        fraction = freeze_fraction(elapsed, self.freeze_start, self.freeze_level)
        return freeze_depth(len(self.layers), fraction)

    events = frozenset({Event.AFTER_BACKWARD, Event.AFTER_TRAIN_BATCH})
    uses_elapsed = True

    def match(self, event: Event, ctx: Context) -> int:
        if event not in (Event.AFTER_BACKWARD, Event.AFTER_TRAIN_BATCH):
            return 0
        return self.depth(ctx.time.elapsed)

    def apply(self, event: Event, ctx: Context) -> Context:
        if event == Event.AFTER_TRAIN_BATCH:
            if ctx.scratch is None:  # no AFTER_BACKWARD in this step: nothing to restore
                return ctx
            return ctx.replace(params={**ctx.params, **ctx.scratch}, scratch=None)
        depth = ctx.matched
        if isinstance(depth, bool) or not isinstance(depth, int):  # applied without match
            depth = self.depth(ctx.time.elapsed)
        if ctx.grads is None:
            raise RuntimeError(f"{self.name}: AFTER_BACKWARD without gradients")
        frozen = _frozen(ctx.params, self.layers[:depth])
        grads = {**ctx.grads, **{k: torch.zeros_like(ctx.grads[k]) for k in frozen}}
        return ctx.replace(grads=grads, scratch={k: ctx.params[k] for k in frozen})

    def __repr__(self) -> str:
        return (
            f"LayerFreezing(freeze_start={self.freeze_start}, freeze_level={self.freeze_level}, "
            f"layers={len(self.layers)})"
        )
