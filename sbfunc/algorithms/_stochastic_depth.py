"""Stochastic depth: drop residual branches at random, block-wise or sample-wise."""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn

from sbfunc.algorithms._surgery import (
    ModuleSelector,
    Surgery,
    matching_modules,
    replace_modules,
    selector,
)
from sbfunc.engine import Algorithm, Context, Event
from sbfunc.validation import check_real

__all__ = ["StochasticBranch", "StochasticDepth"]

Method = Literal["block", "sample"]
Distribution = Literal["linear", "uniform"]
RATE = "stochastic_depth_rate"
SCALE = "stochastic_depth_scale"


class StochasticBranch(nn.Module):
    """A residual branch whose output is dropped at random in training.

    In train mode the output is multiplied by a 0/1 mask that keeps it with probability
    ``1 - rate``: one draw for the whole batch (``"block"``) or one per row (``"sample"``). In
    eval mode it is multiplied by ``1 - rate``, so its expected contribution is unchanged. The
    rate is the product of two 0-d buffers: ``stochastic_depth_rate`` (this branch's rate) and
    ``stochastic_depth_scale`` (the warm-up factor that :class:`StochasticDepth` sets).

    The mask comes from ``torch.rand``, which under :func:`sbfunc.random.keyed` (the training
    step's ``keyed_model``) draws from the step's key: the drops are a pure function of the
    key. The branch is always computed (a multiply by 0, never a data-dependent skip), so the
    step needs no host sync and compiles.

    Args:
        branch: the module whose output is the residual branch (what is added to the skip).
        rate: the drop probability, in ``[0, 1]``.
        method: ``"block"`` or ``"sample"``.
        scale: the initial warm-up factor.

    Example:
        >>> from sbfunc.algorithms import StochasticBranch
        >>> branch = StochasticBranch(torch.nn.Identity(), 0.5, "sample")
        >>> with sbfunc.random.keyed(sbfunc.random.key(0)):
        ...     out = branch(torch.ones(4, 2))
        >>> out[:, 0].int()  # row 0 dropped, the others kept (a mask times 1)
        tensor([0, 1, 1, 1], dtype=torch.int32)
        >>> branch.eval()(torch.ones(1, 2))
        tensor([[0.5000, 0.5000]])

    References:
        Huang et al. 2016, "Deep Networks with Stochastic Depth"; Tan and Le 2019
        (EfficientNet's per-sample drop); MosaicML Composer ``StochasticDepth``.
    """

    random_forward = True
    """Marks a module whose forward draws random numbers (for the step's ``keyed_model``)."""

    def __init__(self, branch: nn.Module, rate: float, method: Method, scale: float = 1.0) -> None:
        super().__init__()
        self.branch = branch
        self.method = method
        self.register_buffer(RATE, torch.tensor(float(rate)))
        self.register_buffer(SCALE, torch.tensor(float(scale)))

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = self.branch(*args, **kwargs)
        keep = 1 - getattr(self, RATE) * getattr(self, SCALE)
        if not self.training:
            return out * keep.to(out.dtype)
        if self.method == "sample":
            shape = (out.shape[0],) + (1,) * (out.dim() - 1)
        else:
            shape = (1,) * out.dim()
        # torch.rand, not rand_like: keyed() routes it under torch.compile too.
        u = torch.rand(shape, dtype=out.dtype, device=out.device)
        return out * (u < keep).to(out.dtype)


def _check(method: Any, drop_rate: Any, distribution: Any) -> tuple[Method, float, Distribution]:
    if method not in ("block", "sample"):
        raise ValueError(f"stochastic_method must be 'block' or 'sample', got {method!r}")
    rate = check_real(drop_rate, "drop_rate", low=0.0, high=1.0)
    if distribution not in ("linear", "uniform"):
        raise ValueError(f"drop_distribution must be 'linear' or 'uniform', got {distribution!r}")
    return method, rate, distribution


def _branches(
    module: nn.Module,
    target: ModuleSelector,
    method: Method,
    rate: float,
    distribution: Distribution,
    scale: float,
) -> nn.Module:
    """The surgery of :class:`StochasticDepth` (its arguments validated)."""
    names = matching_modules(module, selector(target))
    if not names:
        raise ValueError("target matches no module of module: stochastic depth would do nothing")
    index = {name: i for i, name in enumerate(names)}

    def policy(name: str, m: nn.Module) -> nn.Module | None:
        if name not in index:
            return None
        share = (index[name] + 1) / len(names) if distribution == "linear" else 1.0
        return StochasticBranch(m, rate * share, method, scale)

    return replace_modules(module, policy)


class StochasticDepth(Algorithm, Surgery):
    """Composer's ``StochasticDepth``: the surgery, plus the drop-rate warm-up on BATCH_START.

    ``model = sd(model)`` returns a copy of the model (the module passed in is not changed)
    whose target residual branches are :class:`StochasticBranch` es. ``target`` picks the
    modules whose output is a residual branch, i.e. what a block adds to its skip connection:
    in a torchvision ``Bottleneck`` the last batch norm of the branch,
    ``lambda name, m: name.endswith(".bn3")``; in a pre-norm transformer block its attention
    and MLP sub-layers. Composer targets whole ``Bottleneck`` blocks and rewrites their
    ``forward``; wrapping the branch works for any architecture of the ``x + f(x)`` form and
    drops the same thing. With ``"linear"``, the ``i``-th target (``i = 0, 1, ...``, depth
    first) gets ``drop_rate * (i + 1) / count``; with ``"uniform"``, ``drop_rate``. Train the
    model with ``make_train_step(..., keyed_model=True)`` so that the drops come from the
    step's key.

    List ``sd`` among the step's algorithms when ``drop_warmup > 0``: on ``BATCH_START`` it sets
    every branch's warm-up factor to ``min(1, elapsed / drop_warmup)`` (computed from
    ``state.time`` as tensors, so the step compiles once), so the rates grow linearly to their
    full value over that fraction of training (the surgery starts them at 0). Without warm-up
    it matches no event. Unlike Composer, the warm-up also works with ``"sample"`` and ends
    exactly at the full rate.

    Args:
        target: a :data:`~sbfunc.algorithms._surgery.ModuleSelector` of the residual branches.
        stochastic_method: ``"block"`` (drop the branch for the whole batch) or ``"sample"``
            (drop it per row).
        drop_rate: the (largest) drop probability, in ``[0, 1]``.
        drop_distribution: ``"linear"`` or ``"uniform"``.
        drop_warmup: fraction of training over which the rates warm up, in ``[0, 1]``.

    Raises:
        TypeError: for a malformed ``target`` or ``drop_rate``.
        ValueError: for values out of range; calling it, for no target in the module.

    Example:
        >>> from sbfunc.algorithms import StochasticDepth
        >>> net = torch.nn.Sequential(*(torch.nn.Linear(2, 2) for _ in range(4)))
        >>> new = StochasticDepth(torch.nn.Linear, "sample", drop_rate=0.4)(net)
        >>> [round(float(m.stochastic_depth_rate), 2) for m in new]
        [0.1, 0.2, 0.3, 0.4]
        >>> sd = StochasticDepth(torch.nn.Linear, "block", 0.2, "uniform", drop_warmup=0.5)
        >>> net = sd(torch.nn.Sequential(torch.nn.Linear(2, 2)))
        >>> _, buffers = sbfunc.split_module(net)
        >>> ctx = sbfunc.Context(sbfunc.random.key(0), buffers=buffers,
        ...                      time=sbfunc.Time(elapsed=0.25))
        >>> sd.apply(sbfunc.Event.BATCH_START, ctx).buffers["0.stochastic_depth_scale"]
        tensor(0.5000)

    References:
        Huang et al. 2016, "Deep Networks with Stochastic Depth"; MosaicML Composer
        ``StochasticDepth`` and ``apply_stochastic_depth``.
    """

    def __init__(
        self,
        target: ModuleSelector,
        stochastic_method: Method = "block",
        drop_rate: float = 0.2,
        drop_distribution: Distribution = "linear",
        drop_warmup: float = 0.0,
    ) -> None:
        selector(target)  # validate now
        self.target = target
        self.method, self.drop_rate, self.distribution = _check(
            stochastic_method, drop_rate, drop_distribution
        )
        self.drop_warmup = check_real(drop_warmup, "drop_warmup", low=0.0, high=1.0)

    def __call__(self, module: nn.Module) -> nn.Module:
        start = 0.0 if self.drop_warmup > 0 else 1.0
        return _branches(
            module, self.target, self.method, self.drop_rate, self.distribution, start
        )

    events = frozenset({Event.BATCH_START})
    uses_elapsed = True

    def match(self, event: Event, ctx: Context) -> bool:
        return event == Event.BATCH_START and self.drop_warmup > 0

    def apply(self, event: Event, ctx: Context) -> Context:
        names = [k for k in ctx.buffers if k.endswith(SCALE)]
        if not names:
            raise RuntimeError(
                f"{self.name}: the buffers hold no {SCALE}; apply the surgery first: "
                "model = stochastic_depth(model), then split_module(model)"
            )
        elapsed = torch.as_tensor(ctx.time.elapsed, dtype=torch.float32)
        factor = (elapsed / self.drop_warmup).clamp(max=1.0)
        like = ctx.buffers[names[0]]
        factor = factor.to(device=like.device, dtype=like.dtype)
        return ctx.replace(buffers={**ctx.buffers, **dict.fromkeys(names, factor)})

    def __repr__(self) -> str:
        return (
            f"StochasticDepth(stochastic_method={self.method!r}, drop_rate={self.drop_rate}, "
            f"drop_distribution={self.distribution!r}, drop_warmup={self.drop_warmup})"
        )
