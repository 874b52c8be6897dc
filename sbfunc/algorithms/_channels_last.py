"""ChannelsLast: keep 4-D weights and activations in NHWC memory order."""

from __future__ import annotations

import copy

import torch
from torch import nn

from sbfunc.algorithms._surgery import Surgery
from sbfunc.engine import Algorithm, Context, Event
from sbfunc.types import Params

__all__ = ["ChannelsLast", "channels_last_tensors"]


def channels_last_tensors(tensors: Params) -> Params:
    """A new dict with every 4-D tensor of ``tensors`` made channels-last; others as they are.

    Args:
        tensors: name -> tensor (e.g. the params or buffers of :func:`sbfunc.split_module`).

    Returns:
        A new dict; equal values, new memory layout for the 4-D tensors.

    Example:
        >>> out = channels_last_tensors({"w": torch.rand(8, 3, 3, 3), "b": torch.rand(8)})
        >>> out["w"].is_contiguous(memory_format=torch.channels_last), out["b"].dim()
        (True, 1)

    References:
        PyTorch ``Tensor.contiguous(memory_format=torch.channels_last)``.
    """
    return {
        name: t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t
        for name, t in tensors.items()
    }


class ChannelsLast(Algorithm, Surgery):
    """Make the 4-D parameters and buffers channels-last (NHWC): on ``INIT``, or as a surgery.

    The pure counterpart of Composer's ``ChannelsLast`` (which converts the model on
    ``INIT``): the step holds the model as ``params``/``buffers`` dicts, so on ``INIT`` this
    replaces their 4-D tensors by channels-last copies (:func:`channels_last_tensors`); the
    values, and so the model's function, are unchanged. Nothing runs per step; the optimizers
    of :mod:`sbfunc.optim` update elementwise, which keeps the layout. Called on a module
    (``model = ChannelsLast()(model)``), it returns a copy whose 4-D parameters and buffers are
    channels-last, for before :func:`sbfunc.split_module` (the module passed in is not
    changed); convolutions then pick NHWC kernels, usually faster on GPUs with tensor cores.

    Raises:
        TypeError: calling it on a ``module`` that is not a module.

    Example:
        >>> from sbfunc.algorithms import ChannelsLast
        >>> cl = ChannelsLast()
        >>> params = {"conv.weight": torch.rand(8, 3, 3, 3)}
        >>> ctx = sbfunc.Context(sbfunc.random.key(0), params=params)
        >>> out = cl.apply(sbfunc.Event.INIT, ctx)
        >>> out.params["conv.weight"].is_contiguous(memory_format=torch.channels_last)
        True
        >>> conv = torch.nn.Conv2d(3, 8, 3)
        >>> cl(conv).weight.is_contiguous(memory_format=torch.channels_last), bool(
        ...     torch.equal(cl(conv).weight, conv.weight))
        (True, True)

    References:
        PyTorch "Channels Last Memory Format" tutorial; MosaicML Composer ``ChannelsLast`` and
        ``apply_channels_last`` (which converts the model in place).
    """

    uses_key = False  # deterministic: the engine derives no key for it

    events = frozenset({Event.INIT})

    def apply(self, event: Event, ctx: Context) -> Context:
        return ctx.replace(
            params=channels_last_tensors(ctx.params),
            buffers=channels_last_tensors(ctx.buffers),
        )

    def __call__(self, module: nn.Module) -> nn.Module:
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        return copy.deepcopy(module).to(memory_format=torch.channels_last)  # type: ignore[call-overload]
