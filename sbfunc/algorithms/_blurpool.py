"""BlurPool: anti-aliased downsampling by model surgery (blur before strided convs and pools)."""

from __future__ import annotations

import copy
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from sbfunc.algorithms._kornia import kornia
from sbfunc.algorithms._surgery import Surgery
from sbfunc.engine import Algorithm, Context, Event
from sbfunc.validation import check_bool, check_int

__all__ = ["BlurConv2d", "BlurMaxPool2d", "BlurPool"]

_BLUR = 3  # the [1, 2, 1] x [1, 2, 1] / 16 binomial filter (Composer's and the paper's default)


def _square(value: Any) -> int | None:
    """The int of a square 2-D size (``2`` or ``(2, 2)``), else ``None``."""
    if isinstance(value, int):
        return value
    a, b = value
    return int(a) if a == b else None


class BlurConv2d(nn.Module):
    """A strided ``Conv2d`` with a binomial low-pass filter before it (or after it).

    ``blur_first=True``: blur (stride 1), then the convolution with its own stride: the cost
    is the blur alone. ``blur_first=False``: the convolution at stride 1, then the blur with
    the stride (the paper's order, up to ``stride**2`` times the convolution's cost). Either
    way the output has the shape the original convolution gives. The blur is kornia's
    ``filters.blur_pool2d`` (zero padding, as in Composer); the convolution keeps its
    parameters, now named ``conv.weight`` and ``conv.bias``.

    Args:
        conv: the convolution to wrap (copied; it is not modified).
        blur_first: blur before the convolution.

    Example:
        >>> from sbfunc.algorithms import BlurConv2d
        >>> conv = torch.nn.Conv2d(16, 8, 3, stride=2, padding=1)
        >>> blurred = BlurConv2d(conv)
        >>> x = torch.rand(1, 16, 9, 9)
        >>> blurred(x).shape == conv(x).shape
        True

    References:
        Zhang 2019, "Making Convolutional Networks Shift-Invariant Again"; MosaicML Composer
        ``BlurConv2d``; kornia ``filters.blur_pool2d``.
    """

    def __init__(self, conv: nn.Conv2d, *, blur_first: bool = True) -> None:
        super().__init__()
        stride = _square(conv.stride)
        if stride is None:
            raise ValueError(f"BlurConv2d needs a square stride, got {conv.stride}")
        self.blur_first = check_bool(blur_first, "blur_first")
        self.stride = stride
        self.conv = copy.deepcopy(conv)
        if not blur_first:
            self.conv.stride = (1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.blur_first:
            return self.conv(kornia().filters.blur_pool2d(x, _BLUR, stride=1))
        return kornia().filters.blur_pool2d(self.conv(x), _BLUR, stride=self.stride)


class BlurMaxPool2d(nn.Module):
    """``MaxPool2d`` with anti-aliasing: the max at stride 1, a binomial blur, then the stride.

    Same output shape as the max pool it replaces (its kernel, padding and dilation are
    kept); pools with ``return_indices`` (meaningless once blurred) or ``ceil_mode`` (whose
    sizes a strided blur cannot reproduce) are refused.

    Args:
        pool: the max pool to replace (read, not modified).

    Example:
        >>> from sbfunc.algorithms import BlurMaxPool2d
        >>> pool = torch.nn.MaxPool2d(3, stride=2, padding=1)
        >>> x = torch.rand(1, 4, 10, 10)
        >>> BlurMaxPool2d(pool)(x).shape == pool(x).shape
        True

    References:
        Zhang 2019; MosaicML Composer ``BlurMaxPool2d``; kornia ``filters.max_blur_pool2d``.
    """

    def __init__(self, pool: nn.MaxPool2d) -> None:
        super().__init__()
        stride = _square(pool.stride)
        if stride is None or pool.return_indices or pool.ceil_mode:
            raise ValueError(
                "BlurMaxPool2d needs a square stride, return_indices=False and ceil_mode=False "
                f"(a blur at the stride cannot give ceil_mode's sizes), got {pool}"
            )
        self.kernel_size, self.stride = pool.kernel_size, stride
        self.padding, self.dilation = pool.padding, pool.dilation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        maxes = F.max_pool2d(x, self.kernel_size, 1, self.padding, self.dilation)
        return kornia().filters.blur_pool2d(maxes, _BLUR, stride=self.stride)


class _Rules(NamedTuple):
    convs: bool
    maxpools: bool
    blur_first: bool
    min_channels: int


def _replacement(child: nn.Module, rules: _Rules) -> nn.Module | None:
    """The blurred layer that replaces ``child``, or ``None`` to keep it."""
    if rules.convs and isinstance(child, nn.Conv2d) and type(child) is nn.Conv2d:
        stride = _square(child.stride)
        if stride is not None and stride > 1 and child.in_channels >= rules.min_channels:
            return BlurConv2d(child, blur_first=rules.blur_first)
    if rules.maxpools and isinstance(child, nn.MaxPool2d) and type(child) is nn.MaxPool2d:
        plain = _square(child.stride) is not None and not (child.return_indices or child.ceil_mode)
        return BlurMaxPool2d(child) if plain else None
    return None


def _surgery(module: nn.Module, rules: _Rules) -> None:
    for name, child in module.named_children():
        new = _replacement(child, rules)
        if new is not None:
            setattr(module, name, new)
        elif not isinstance(child, BlurConv2d | BlurMaxPool2d):
            _surgery(child, rules)


class BlurPool(Algorithm, Surgery):
    """Composer's ``BlurPool`` as a surgery: ``model = BlurPool()(model)``, anti-aliased strided
    convolutions and max pools.

    Calling it returns a copy of the model in which every ``nn.Conv2d`` (exactly that class)
    with a square stride > 1 and at least ``min_channels`` input channels is a
    :class:`BlurConv2d`, and every ``nn.MaxPool2d`` with a square stride (without ``ceil_mode``
    or ``return_indices``) a :class:`BlurMaxPool2d`; already blurred layers are left alone, so
    applying it twice changes nothing more. Parameter values are kept (a wrapped convolution's
    names gain ``.conv``), output shapes are kept, and the module passed in is not modified.
    Call it before :func:`sbfunc.split_module`.

    It is an algorithm too, matching no event, as Composer lists it among a trainer's
    algorithms: in a step's algorithm list it records the setting and costs nothing.

    Args:
        replace_convs: blur strided convolutions.
        replace_maxpools: blur max pools.
        blur_first: blur before the convolution (cheaper; see :class:`BlurConv2d`).
        min_channels: convolutions with fewer input channels (e.g. the RGB stem) are kept.

    Raises:
        TypeError: for a flag that is not a bool; calling it, for a ``module`` that is not a
            module.
        ValueError: if ``min_channels < 0``.
        ImportError: without kornia (``pip install 'sbfunc[image]'``).

    Example:
        >>> from sbfunc.algorithms import BlurPool
        >>> net = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, stride=2), torch.nn.MaxPool2d(2))
        >>> [type(m).__name__ for m in BlurPool()(net)]
        ['BlurConv2d', 'BlurMaxPool2d']
        >>> [type(m).__name__ for m in net]  # the input is untouched
        ['Conv2d', 'MaxPool2d']
        >>> BlurPool().match(sbfunc.Event.INIT, sbfunc.Context(None))
        False

    References:
        Zhang 2019, "Making Convolutional Networks Shift-Invariant Again"; MosaicML Composer
        ``BlurPool`` and ``apply_blurpool`` (which edit the model in place).
    """

    uses_key = False  # deterministic: the engine derives no key for it

    def __init__(
        self,
        replace_convs: bool = True,
        replace_maxpools: bool = True,
        blur_first: bool = True,
        min_channels: int = 16,
    ) -> None:
        kornia()  # the optional extra, checked at construction
        self.replace_convs = check_bool(replace_convs, "replace_convs")
        self.replace_maxpools = check_bool(replace_maxpools, "replace_maxpools")
        self.blur_first = check_bool(blur_first, "blur_first")
        self.min_channels = check_int(min_channels, "min_channels", low=0)

    def __call__(self, module: nn.Module) -> nn.Module:
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        rules = _Rules(
            self.replace_convs, self.replace_maxpools, self.blur_first, self.min_channels
        )
        out = copy.deepcopy(module)
        new = _replacement(out, rules)
        if new is not None:  # the module itself is a strided conv or a max pool
            return new
        _surgery(out, rules)
        return out

    events = frozenset()

    def apply(self, event: Event, ctx: Context) -> Context:
        return ctx
