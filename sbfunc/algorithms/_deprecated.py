"""1.1's function spelling of the surgeries, ``apply_x(model, ...)``: each is
``X(...)(model)``, the one spelling since 1.2. ``sbfunc.algorithms.apply_x`` warns, naming it,
until 1.3 (the face's ``__getattr__``); the functions here do what they did in 1.1.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from sbfunc.algorithms._alibi import Alibi
from sbfunc.algorithms._blurpool import BlurPool
from sbfunc.algorithms._channels_last import ChannelsLast
from sbfunc.algorithms._ghost_batchnorm import GhostBatchNorm
from sbfunc.algorithms._squeeze_excite import SqueezeExcite
from sbfunc.algorithms._stochastic_depth import (
    SCALE,
    Distribution,
    Method,
    StochasticBranch,
    StochasticDepth,
)
from sbfunc.algorithms._surgery import ModuleSelector

__all__ = ["SPELLINGS"]


def apply_alibi(
    module: nn.Module,
    max_sequence_length: int,
    *,
    position_embeddings: Sequence[str] | None = None,
) -> nn.Module:
    """``Alibi(max_sequence_length, position_embeddings=...)(module)``."""
    return Alibi(max_sequence_length, position_embeddings=position_embeddings)(module)


def apply_blurpool(
    module: nn.Module,
    *,
    replace_convs: bool = True,
    replace_maxpools: bool = True,
    blur_first: bool = True,
    min_channels: int = 16,
) -> nn.Module:
    """``BlurPool(replace_convs, replace_maxpools, blur_first, min_channels)(module)``."""
    # mypy cannot see the match that declaring ``events`` gives an algorithm
    surgery = BlurPool(replace_convs, replace_maxpools, blur_first, min_channels)  # type: ignore[abstract]
    return surgery(module)


def apply_channels_last(module: nn.Module) -> nn.Module:
    """``ChannelsLast()(module)``."""
    return ChannelsLast()(module)  # type: ignore[abstract]


def apply_ghost_batchnorm(module: nn.Module, ghost_batch_size: int = 32) -> nn.Module:
    """``GhostBatchNorm(ghost_batch_size)(module)``."""
    return GhostBatchNorm(ghost_batch_size)(module)


def apply_squeeze_excite(
    module: nn.Module, latent_channels: float = 64, min_channels: int = 128
) -> nn.Module:
    """``SqueezeExcite(latent_channels, min_channels)(module)``."""
    return SqueezeExcite(latent_channels, min_channels)(module)


def apply_stochastic_depth(
    module: nn.Module,
    target: ModuleSelector,
    stochastic_method: Method = "block",
    drop_rate: float = 0.2,
    drop_distribution: Distribution = "linear",
    *,
    scale: float = 1.0,
) -> nn.Module:
    """``StochasticDepth(target, stochastic_method, drop_rate, drop_distribution)(module)``,
    every branch's warm-up factor set to ``scale``."""
    new = StochasticDepth(target, stochastic_method, drop_rate, drop_distribution)(module)
    if scale != 1.0:
        for m in new.modules():
            if isinstance(m, StochasticBranch):
                m.register_buffer(SCALE, torch.tensor(float(scale)))
    return new


SPELLINGS = {
    "apply_alibi": "Alibi(max_sequence_length, ...)(model)",
    "apply_blurpool": "BlurPool(...)(model)",
    "apply_channels_last": "ChannelsLast()(model)",
    "apply_ghost_batchnorm": "GhostBatchNorm(ghost_batch_size)(model)",
    "apply_squeeze_excite": "SqueezeExcite(...)(model)",
    "apply_stochastic_depth": "StochasticDepth(target, ...)(model)",
}
"""Each deprecated function's name and the surgery call that replaces it (1.2)."""
