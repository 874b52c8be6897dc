"""Per-sample gradient quantities of Linear and Conv layers from their inputs and output grads.

Both layers are contractions ``y[n, t, g, :] = W_g x[n, t, g, :] (+ b)``: a Linear layer on
``[N, *, I]`` inputs has ``T = prod(*)`` positions and ``G = 1`` group; a convolution has
``T`` output positions, ``G`` groups and ``I = C/G * prod(kernel)`` (the unfolded patches).
With ``g[n, t, g, :]`` the gradient of the summed loss w.r.t. the layer output (per sample,
because samples are independent), the per-sample weight gradient is
``sum_t g[n, t] x[n, t]^T`` and

* its squared norm is ``||x_n||^2 ||g_n||^2`` when ``T == 1`` and the Gram form
  ``sum_{s,t} (x_s . x_t)(g_s . g_t)`` otherwise (when ``T^2 <= I * O``), so per-sample
  gradients are never materialized (BackPACK's ``BatchL2Grad``, Opacus's ghost clipping);
* its elementwise sum of squares over samples is ``(g^2)^T (x^2)`` when ``T == 1``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F

__all__ = ["Contraction", "conv_contraction", "linear_contraction"]


class Contraction(NamedTuple):
    """One recorded layer call as a per-sample contraction.

    Attributes:
        x: layer input as ``[N, T, G, I]`` (detached).
        out_shape: how to view the output gradient ``[N, *out]`` as ``[N, T, G, O]``:
            ``"last"`` (Linear: features last) or ``"channels"`` (Conv: ``[N, G*O, *L]``).
        groups: ``G``.
        weight_shape: the weight's shape, to reshape ``[G, O, I]`` results.
    """

    x: torch.Tensor
    out_shape: str
    groups: int
    weight_shape: torch.Size

    def out_grad(self, g: torch.Tensor) -> torch.Tensor:
        """The output gradient ``[N, *out]`` viewed as ``[N, T, G, O]``."""
        n = g.shape[0]
        if self.out_shape == "last":
            return g.reshape(n, -1, 1, g.shape[-1])
        g = g.reshape(n, self.groups, g.shape[1] // self.groups, -1)
        return g.permute(0, 3, 1, 2)

    def weight_grads(self, g: torch.Tensor) -> torch.Tensor:
        """Per-sample weight gradients ``[N, *weight_shape]``."""
        w = torch.einsum("ntgo,ntgi->ngoi", g, self.x)
        return w.reshape(g.shape[0], *self.weight_shape)

    def weight_sq_norms(self, g: torch.Tensor) -> torch.Tensor:
        """Per-sample squared weight-gradient norms ``[N]`` (materialized only when cheaper)."""
        x, (n, t, _, i), o = self.x, self.x.shape, g.shape[-1]
        if t == 1:
            return (x.square().sum(-1) * g.square().sum(-1)).flatten(1).sum(1)
        if t * t <= i * o:
            gram_x = torch.einsum("ntgi,nsgi->ngts", x, x)
            gram_g = torch.einsum("ntgo,nsgo->ngts", g, g)
            return (gram_x * gram_g).flatten(1).sum(1)
        return self.weight_grads(g).square().reshape(n, -1).sum(1)

    def weight_sum_sq(self, g: torch.Tensor) -> torch.Tensor:
        """``sum_n (grad_W,n)^2`` elementwise, shaped like the weight."""
        if self.x.shape[1] == 1:
            w = torch.einsum("ngo,ngi->goi", g[:, 0].square(), self.x[:, 0].square())
            return w.reshape(self.weight_shape)
        return self.weight_grads(g).square().sum(0)

    def weight_sum(self, g: torch.Tensor) -> torch.Tensor:
        """``sum_n grad_W,n`` (the ordinary gradient of the summed loss)."""
        return torch.einsum("ntgo,ntgi->goi", g, self.x).reshape(self.weight_shape)

    @staticmethod
    def bias_grads(g: torch.Tensor) -> torch.Tensor:
        """Per-sample bias gradients ``[N, G*O]``."""
        return g.sum(1).reshape(g.shape[0], -1)


def linear_contraction(x: torch.Tensor, weight: torch.Tensor) -> Contraction:
    """The contraction of ``F.linear(x, weight)`` for an input ``[N, *, I]``.

    Example:
        >>> from sbfunc.per_sample.layers import linear_contraction
        >>> linear_contraction(torch.ones(4, 3, 2), torch.ones(5, 2)).x.shape
        torch.Size([4, 3, 1, 2])
    """
    x = x.detach()
    return Contraction(x.reshape(x.shape[0], -1, 1, x.shape[-1]), "last", 1, weight.shape)


def _pads(
    padding: str | Sequence[int], kernel: Sequence[int], dilation: Sequence[int]
) -> list[int]:
    """``F.pad`` amounts (last spatial dim first) for int or ``'valid'``/``'same'`` padding."""
    if isinstance(padding, str):
        total = [
            0 if padding == "valid" else d * (k - 1) for k, d in zip(kernel, dilation, strict=True)
        ]
        pairs = [(t // 2, t - t // 2) for t in total]
    else:
        pairs = [(p, p) for p in padding]
    return [p for pair in reversed(pairs) for p in pair]


def conv_contraction(
    x: torch.Tensor,
    weight: torch.Tensor,
    stride: Sequence[int],
    padding: str | Sequence[int],
    dilation: Sequence[int],
    groups: int,
) -> Contraction:
    """The contraction of an N-d convolution ``[N, C, *L] -> [N, O, *L']`` (unfolded patches).

    Works for 1-d, 2-d and 3-d convolutions with any stride, dilation, groups and padding
    (``'same'`` pads like torch: the extra element goes right).

    Example:
        >>> from sbfunc.per_sample.layers import conv_contraction
        >>> c = conv_contraction(torch.ones(2, 4, 5, 5), torch.ones(6, 2, 3, 3), (1, 1), (1, 1),
        ...                      (1, 1), 2)
        >>> c.x.shape  # [N, 25 positions, 2 groups, 2 channels * 9 taps]
        torch.Size([2, 25, 2, 18])
    """
    kernel = weight.shape[2:]
    d = len(kernel)
    patches = F.pad(x.detach(), _pads(padding, kernel, dilation))
    for dim, (k, s, dil) in enumerate(zip(kernel, stride, dilation, strict=True)):
        patches = patches.unfold(2 + dim, dil * (k - 1) + 1, s)
        if dil > 1:
            patches = patches[..., ::dil]
    n, c = x.shape[:2]
    positions = patches.shape[2 : 2 + d]
    patches = patches.reshape(n, groups, c // groups, *positions, *kernel)
    order = [0, *range(3, 3 + d), 1, 2, *range(3 + d, 3 + 2 * d)]
    patches = patches.permute(order).reshape(
        n, math.prod(positions), groups, (c // groups) * math.prod(kernel)
    )
    return Contraction(patches, "channels", groups, weight.shape)
