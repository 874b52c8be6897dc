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

__all__ = ["Contraction", "ConvLayer", "conv_contraction", "linear_contraction"]


class Contraction(NamedTuple):
    """One recorded layer call as a per-sample contraction.

    Attributes:
        x: layer input as ``[N, T, G, I]`` (detached).
        out_shape: how to view the output gradient ``[N, *out]`` as ``[N, T, G, O]``:
            ``"last"`` (Linear: features last) or ``"channels"`` (Conv: ``[N, G*O, *L]``).
        groups: ``G``.
        weight_shape: the weight's shape, to reshape ``[G, O, I]`` results.

    Methods take the output gradient as returned by :meth:`out_grad` and return per-sample
    (``weight_grads``, ``weight_sq_norms``, ``bias_grads``) or summed (``weight_sum``,
    ``weight_sum_sq``) quantities.

    Example:
        >>> c = linear_contraction(torch.tensor([[1.0, 2.0]]), torch.zeros(1, 2))
        >>> g = c.out_grad(torch.tensor([[3.0]]))
        >>> c.weight_grads(g), c.weight_sq_norms(g)
        (tensor([[[3., 6.]]]), tensor([45.]))

    References:
        Goodfellow 2015, "Efficient per-example gradient computations"; Rochette et al. 2019,
        "Efficient per-example gradient computations in convolutional neural networks".
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

    def bias_grads(self, g: torch.Tensor) -> torch.Tensor:
        """Per-sample bias gradients ``[N, G*O]`` from the viewed output gradient."""
        return g.sum(1).reshape(g.shape[0], -1)

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


def linear_contraction(x: torch.Tensor, weight: torch.Tensor) -> Contraction:
    """The contraction of ``F.linear(x, weight)`` for an input ``[N, *, I]``.

    Args:
        x: the layer input, ``[N, *, I]``.
        weight: the weight ``[O, I]`` (only its shape is used).

    Returns:
        A :class:`Contraction` with ``x`` viewed as ``[N, T, 1, I]``.

    Example:
        >>> linear_contraction(torch.ones(4, 3, 2), torch.ones(5, 2)).x.shape
        torch.Size([4, 3, 1, 2])

    References:
        Goodfellow 2015, "Efficient per-example gradient computations"; Rochette et al. 2019,
        "Efficient per-example gradient computations in convolutional neural networks".
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
    weight_shape: torch.Size,
    stride: Sequence[int],
    padding: str | Sequence[int],
    dilation: Sequence[int],
    groups: int,
) -> Contraction:
    """The contraction of an N-d convolution ``[N, C, *L] -> [N, O, *L']`` (unfolded patches).

    Works for 1-d, 2-d and 3-d convolutions with any stride, dilation, groups and padding
    (``'same'`` pads like torch: the extra element goes right).

    Args:
        x: the input ``[N, C, *L]``.
        weight_shape: ``[O, C/G, *kernel]``.
        stride: per spatial dimension.
        padding: per spatial dimension, or ``'same'`` / ``'valid'``.
        dilation: per spatial dimension.
        groups: ``G``.

    Returns:
        A :class:`Contraction` over ``[N, prod(L'), G, C/G * prod(kernel)]`` patches.

    Example:
        >>> c = conv_contraction(torch.ones(2, 4, 5, 5), torch.Size([6, 2, 3, 3]), (1, 1),
        ...                      (1, 1), (1, 1), 2)
        >>> c.x.shape  # [N, 25 positions, 2 groups, 2 channels * 9 taps]
        torch.Size([2, 25, 2, 18])

    References:
        Goodfellow 2015, "Efficient per-example gradient computations"; Rochette et al. 2019,
        "Efficient per-example gradient computations in convolutional neural networks".
    """
    kernel = weight_shape[2:]
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
    return Contraction(patches, "channels", groups, weight_shape)


class ConvLayer(NamedTuple):
    """A recorded N-d convolution. Per-sample weight gradients come from one grouped
    ``convolution_backward`` with the samples folded into the groups (no unfolded copy of the
    input); squared norms use the Gram form of :func:`conv_contraction` when it is cheaper.

    Attributes:
        x: the input ``[N, C, *L]`` (detached), already padded when ``padding`` was a string.
        weight_shape: ``[O, C/G, *kernel]``.
        stride, padding, dilation: per spatial dimension (ints).
        groups: ``G``.

    Example:
        >>> layer = ConvLayer(torch.ones(2, 1, 4), torch.Size([3, 1, 2]), (1,), (0,), (1,), 1)
        >>> layer.weight_grads(torch.ones(2, 3, 3)).shape
        torch.Size([2, 3, 1, 2])

    References:
        Goodfellow 2015, "Efficient per-example gradient computations"; Rochette et al. 2019,
        "Efficient per-example gradient computations in convolutional neural networks".
    """

    x: torch.Tensor
    weight_shape: torch.Size
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int

    def out_grad(self, g: torch.Tensor) -> torch.Tensor:
        """The output gradient as it is: ``[N, O, *L']``."""
        return g

    def bias_grads(self, g: torch.Tensor) -> torch.Tensor:
        """Per-sample bias gradients ``[N, O]``."""
        return g.flatten(2).sum(2)

    def _weight_backward(self, g: torch.Tensor, x: torch.Tensor, groups: int) -> torch.Tensor:
        shape = (g.shape[1], *self.weight_shape[1:])
        weight = g.new_zeros(()).expand(shape)  # only its shape is read
        d = len(self.stride)
        return torch.ops.aten.convolution_backward(
            g,
            x,
            weight,
            None,
            self.stride,
            self.padding,
            self.dilation,
            False,
            [0] * d,
            groups,
            [False, True, False],
        )[1]

    def weight_grads(self, g: torch.Tensor) -> torch.Tensor:
        """Per-sample weight gradients ``[N, *weight_shape]``."""
        n = g.shape[0]
        folded = self._weight_backward(
            g.reshape(1, -1, *g.shape[2:]),
            self.x.reshape(1, -1, *self.x.shape[2:]),
            n * self.groups,
        )
        return folded.reshape(n, *self.weight_shape)

    def _gram(self, g: torch.Tensor) -> Contraction | None:
        t, o = math.prod(g.shape[2:]), g.shape[1] // self.groups
        i = math.prod(self.weight_shape[1:])
        if t * t > i * o:
            return None
        return conv_contraction(
            self.x, self.weight_shape, self.stride, self.padding, self.dilation, self.groups
        )

    def weight_sq_norms(self, g: torch.Tensor) -> torch.Tensor:
        """Per-sample squared weight-gradient norms ``[N]``."""
        c = self._gram(g)
        if c is not None:
            return c.weight_sq_norms(c.out_grad(g))
        return self.weight_grads(g).square().reshape(g.shape[0], -1).sum(1)

    def weight_sum_sq(self, g: torch.Tensor) -> torch.Tensor:
        """``sum_n (grad_W,n)^2`` elementwise."""
        return self.weight_grads(g).square().sum(0)

    def weight_sum(self, g: torch.Tensor) -> torch.Tensor:
        """``sum_n grad_W,n``: one ordinary weight backward."""
        return self._weight_backward(g, self.x, self.groups)


def conv_layer(
    x: torch.Tensor,
    weight: torch.Tensor,
    stride: Sequence[int],
    padding: str | Sequence[int],
    dilation: Sequence[int],
    groups: int,
) -> ConvLayer:
    """A :class:`ConvLayer` for ``conv(x, weight, stride, padding, dilation, groups)``; string
    paddings (``'same'``, ``'valid'``) are applied to the input up front.

    Args:
        x: the input ``[N, C, *L]``.
        weight: the weight ``[O, C/G, *kernel]`` (only its shape is used).
        stride: per spatial dimension.
        padding: per spatial dimension, or ``'same'`` / ``'valid'``.
        dilation: per spatial dimension.
        groups: ``G``.

    Returns:
        A :class:`ConvLayer`.

    Example:
        >>> conv_layer(torch.ones(2, 1, 5), torch.ones(3, 1, 2), (1,), "same", (1,), 1).x.shape
        torch.Size([2, 1, 6])

    References:
        Goodfellow 2015, "Efficient per-example gradient computations"; Rochette et al. 2019,
        "Efficient per-example gradient computations in convolutional neural networks".
    """
    x = x.detach()
    d = len(stride)
    if isinstance(padding, str):
        x = F.pad(x, _pads(padding, weight.shape[2:], dilation))
        padding = (0,) * d
    return ConvLayer(x, weight.shape, tuple(stride), tuple(padding), tuple(dilation), groups)
