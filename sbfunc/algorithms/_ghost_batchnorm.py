"""Ghost BatchNorm: batch normalisation over fixed-size chunks of the batch (model surgery)."""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from sbfunc.algorithms._surgery import Surgery, replace_modules
from sbfunc.validation import check_int

__all__ = [
    "GhostBatchNorm",
    "GhostBatchNorm1d",
    "GhostBatchNorm2d",
    "GhostBatchNorm3d",
]


class _Ghost(nn.modules.batchnorm._BatchNorm):
    """Train-mode batch norm over chunks of ``ghost_batch_size`` rows (eval mode: unchanged)."""

    ghost_batch_size: int = 32

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        chunks = input.shape[0] // self.ghost_batch_size
        if not self.training or chunks <= 1:
            return super().forward(input)
        self._check_input_dim(input)
        parts = input.tensor_split(chunks)  # near-equal sizes, each >= ghost_batch_size
        return torch.cat([self._normalize(part, len(parts)) for part in parts])

    def _normalize(self, x: torch.Tensor, parts: int) -> torch.Tensor:
        # nn.BatchNorm's train-mode forward on one chunk, with the momentum shared by the chunks
        # (so one batch moves the running statistics about as much as without ghost batches).
        running = self.track_running_stats and self.running_mean is not None
        factor = 0.0
        if running and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)  # the step passes fresh buffer copies
            if self.momentum is None:  # cumulative average, exactly as nn.BatchNorm computes it
                factor = 1.0 / float(self.num_batches_tracked)
        if self.momentum is not None:
            factor = self.momentum / parts
        return F.batch_norm(
            x,
            self.running_mean if running else None,
            self.running_var if running else None,
            self.weight,
            self.bias,
            True,
            factor,
            self.eps,
        )


class GhostBatchNorm1d(_Ghost, nn.BatchNorm1d):
    """``nn.BatchNorm1d`` that normalises each chunk of ``ghost_batch_size`` rows on its own.

    Same parameters, buffers and names as the ``BatchNorm1d`` it replaces; eval mode is
    unchanged. See :class:`GhostBatchNorm`.
    """


class GhostBatchNorm2d(_Ghost, nn.BatchNorm2d):
    """``nn.BatchNorm2d`` that normalises each chunk of ``ghost_batch_size`` rows on its own.

    See :class:`GhostBatchNorm1d`.
    """


class GhostBatchNorm3d(_Ghost, nn.BatchNorm3d):
    """``nn.BatchNorm3d`` that normalises each chunk of ``ghost_batch_size`` rows on its own.

    See :class:`GhostBatchNorm1d`.
    """


_GHOSTS: dict[type, type[_Ghost]] = {
    nn.BatchNorm1d: GhostBatchNorm1d,
    nn.BatchNorm2d: GhostBatchNorm2d,
    nn.BatchNorm3d: GhostBatchNorm3d,
}


class GhostBatchNorm(Surgery):
    """Composer's ``GhostBatchNorm`` as a surgery: ``model = GhostBatchNorm(32)(model)``, a copy
    of the model whose ``BatchNorm1d/2d/3d`` layers use ghost batches.

    In train mode each replaced layer splits its input along the batch dimension into
    ``N // ghost_batch_size`` chunks of near-equal sizes (``torch.tensor_split``: each has at
    least ``ghost_batch_size`` rows), normalises every chunk with its own statistics, and
    updates the running statistics once per chunk with the momentum divided by the number of
    chunks. A batch of fewer than ``2 * ghost_batch_size`` rows (Selective Backprop's kept
    rows, say) is one chunk: plain batch norm. Eval mode is plain batch norm. Composer makes
    ``ceil(N / ghost_batch_size)`` chunks of at most that size (so a last chunk of one row
    fails in train mode) and refuses batches smaller than a ghost batch; both agree when
    ``ghost_batch_size`` divides ``N``. Parameter and buffer names do not change, so
    ``split_module`` and checkpoints see the same dicts. Only layers of exactly these three
    classes are replaced (subclasses may override ``forward``). Not an algorithm: it acts
    before ``split_module``; the module passed in is not changed.

    Args:
        ghost_batch_size: rows per ghost batch, ``>= 1``.

    Raises:
        TypeError: if ``ghost_batch_size`` is not an int.
        ValueError: if ``ghost_batch_size < 1``; calling it, if the module has no such layer.

    Example:
        >>> from sbfunc.algorithms import GhostBatchNorm
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
        >>> ghost = GhostBatchNorm(ghost_batch_size=2)(net)
        >>> type(ghost[1]).__name__, type(net[1]).__name__, ghost[1].ghost_batch_size
        ('GhostBatchNorm1d', 'BatchNorm1d', 2)
        >>> out = ghost(torch.randn(6, 3))  # three ghost batches of two rows
        >>> torch.allclose(out[:2].mean(0), torch.zeros(4), atol=1e-6)
        True

    References:
        Hoffer et al. 2017, "Train longer, generalize better: closing the generalization gap in
        large batch training of neural networks"; MosaicML Composer ``GhostBatchNorm``.
    """

    def __init__(self, ghost_batch_size: int = 32) -> None:
        self.ghost_batch_size = check_int(ghost_batch_size, "ghost_batch_size", low=1)

    def __call__(self, module: nn.Module) -> nn.Module:
        size, found = self.ghost_batch_size, []

        def policy(name: str, m: nn.Module) -> nn.Module | None:
            ghost = _GHOSTS.get(type(m))
            if ghost is None:
                return None
            m.__class__ = ghost  # m belongs to the deep copy: same tensors, new forward
            new = cast(_Ghost, m)
            new.ghost_batch_size = size
            found.append(name)
            return new

        new = replace_modules(module, policy)
        if not found:
            raise ValueError(
                "module has no nn.BatchNorm1d, BatchNorm2d or BatchNorm3d layer: ghost batch "
                "norm would change nothing"
            )
        return new

    def __repr__(self) -> str:
        return f"GhostBatchNorm(ghost_batch_size={self.ghost_batch_size})"
