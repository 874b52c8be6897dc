"""Squeeze-and-Excitation: a channel-attention block after wide convolutions (model surgery)."""

from __future__ import annotations

import torch
from torch import nn

from sbfunc.algorithms._surgery import Surgery, replace_modules
from sbfunc.validation import check_int, check_real

__all__ = ["SqueezeExcite", "SqueezeExcite2d", "SqueezeExciteConv2d"]


def _latent(num_features: int, latent_channels: float) -> int:
    width = latent_channels if latent_channels >= 1 else latent_channels * num_features
    return max(1, int(width))


class SqueezeExcite2d(nn.Module):
    """Rescale each channel of ``x`` by a gate computed from the whole image.

    ``gate = sigmoid(W2 relu(W1 mean_hw(x)))`` (two bias-free linear layers, hidden width
    ``latent_channels``, or that fraction of ``num_features`` when below 1), then
    ``x * gate[:, :, None, None]``.

    Args:
        num_features: channels of the input.
        latent_channels: hidden width (``>= 1``), or a fraction of ``num_features`` (``< 1``).

    Example:
        >>> from sbfunc.algorithms import SqueezeExcite2d
        >>> se = SqueezeExcite2d(8, latent_channels=0.5)
        >>> se.pool_and_mlp[2].out_features, se(torch.randn(2, 8, 3, 3)).shape
        (4, torch.Size([2, 8, 3, 3]))

    References:
        Hu et al. 2018, "Squeeze-and-Excitation Networks"; MosaicML Composer
        ``SqueezeExcite2d``.
    """

    def __init__(self, num_features: int, latent_channels: float = 0.125) -> None:
        super().__init__()
        latent = _latent(num_features, latent_channels)
        self.pool_and_mlp = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(num_features, latent, bias=False),
            nn.ReLU(),
            nn.Linear(latent, num_features, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.pool_and_mlp(x)
        return x * gate[:, :, None, None]


class SqueezeExciteConv2d(nn.Module):
    """A ``Conv2d`` followed by a :class:`SqueezeExcite2d` on its output.

    The convolution keeps its tensors, now named ``conv.*``; the block's are ``se.*``.

    Args:
        conv: the convolution.
        latent_channels: see :class:`SqueezeExcite2d`.

    Example:
        >>> from sbfunc.algorithms import SqueezeExciteConv2d
        >>> block = SqueezeExciteConv2d(torch.nn.Conv2d(3, 4, 1), latent_channels=2)
        >>> block(torch.randn(1, 3, 5, 5)).shape
        torch.Size([1, 4, 5, 5])

    References:
        Hu et al. 2018; MosaicML Composer ``SqueezeExciteConv2d``.
    """

    def __init__(self, conv: nn.Conv2d, latent_channels: float = 0.125) -> None:
        super().__init__()
        self.conv = conv
        self.se = SqueezeExcite2d(conv.out_channels, latent_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.se(self.conv(x))


class SqueezeExcite(Surgery):
    """Composer's ``SqueezeExcite`` as a surgery: ``model = SqueezeExcite()(model)``, a copy of
    the model with a Squeeze-and-Excitation block after every wide ``Conv2d``.

    A ``Conv2d`` ``c`` gets a block when ``min(c.in_channels, c.out_channels) >=
    min_channels``; convolutions already followed by one (a :class:`SqueezeExciteConv2d`) are
    left alone, so applying the surgery twice adds nothing more. The new blocks are initialised
    by torch's default initialisation (seed torch to reproduce them, as when building the
    model). The function changes: each gate lies in ``(0, 1)``. Not an algorithm: it acts
    before ``split_module``; the module passed in is not changed.

    Args:
        latent_channels: hidden width of each block (``>= 1``), or a fraction of the
            convolution's output channels (``< 1``); ``> 0``.
        min_channels: the channel threshold, ``>= 0``.

    Raises:
        TypeError: for arguments of the wrong type.
        ValueError: for ``latent_channels <= 0`` or ``min_channels < 0``; calling it, for a
            model without a wide enough convolution.

    Example:
        >>> from sbfunc.algorithms import SqueezeExcite
        >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Conv2d(8, 8, 3))
        >>> new = SqueezeExcite(latent_channels=0.25, min_channels=8)(net)
        >>> [type(m).__name__ for m in new]
        ['Conv2d', 'SqueezeExciteConv2d']
        >>> net = SqueezeExcite(latent_channels=4, min_channels=2)(torch.nn.Conv2d(2, 2, 1))
        >>> sorted(name for name, _ in net.named_parameters())[-2:]
        ['se.pool_and_mlp.2.weight', 'se.pool_and_mlp.4.weight']

    References:
        Hu et al. 2018, "Squeeze-and-Excitation Networks"; MosaicML Composer ``SqueezeExcite``
        and ``apply_squeeze_excite``.
    """

    def __init__(self, latent_channels: float = 64, min_channels: int = 128) -> None:
        self.latent_channels = check_real(
            latent_channels, "latent_channels", low=0.0, open_low=True
        )
        self.min_channels = check_int(min_channels, "min_channels", low=0)

    def __call__(self, module: nn.Module) -> nn.Module:
        latent, low, found = self.latent_channels, self.min_channels, []

        def policy(name: str, m: nn.Module) -> nn.Module | None:
            if isinstance(m, SqueezeExciteConv2d):
                found.append(name)
                return m  # already excited: keep it, and do not wrap its convolution again
            if type(m) is nn.Conv2d and min(m.in_channels, m.out_channels) >= low:
                found.append(name)
                return SqueezeExciteConv2d(m, latent)
            return None

        new = replace_modules(module, policy)
        if not found:
            raise ValueError(
                f"module has no nn.Conv2d with min(in_channels, out_channels) >= min_channels="
                f"{low}: squeeze-excite would change nothing"
            )
        return new

    def __repr__(self) -> str:
        return (
            f"SqueezeExcite(latent_channels={self.latent_channels}, "
            f"min_channels={self.min_channels})"
        )
