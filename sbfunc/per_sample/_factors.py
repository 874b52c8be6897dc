"""The square-root factors ``J_n^T S_n`` of the GGN, chunk by chunk: the machinery behind
:mod:`sbfunc.per_sample` and :mod:`sbfunc.per_sample`.

Per chunk of the selected samples, one forward runs under a
:class:`~sbfunc.per_sample._intercept.LayerRecorder`; the loss Hessian square roots ``V``
(``[R, m, *out]``, :mod:`~sbfunc.per_sample`) are backpropagated from the model
output to the recorded Linear/Conv outputs in one batched backward (``is_grads_batched``: the
``R`` columns are a vmapped dimension of the backward, like BackPACK's matrix backpropagation),
and each covered weight's factors follow from its input: ``sum_t g[r, n, t] x[n, t]^T`` for
Linear layers, one grouped ``convolution_backward`` for convolutions (samples folded into the
groups, the ``R`` columns into each group's output channels). Every other parameter gets
``J_n^T v`` as the per-sample gradient of the linearized loss ``<f_n, v>``, through
:func:`~sbfunc.per_sample._fallback.vmap_grads` (and its per-sample loop where ``vmap`` fails)
on the chunk repeated ``R`` times.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import torch

from sbfunc.batch import take
from sbfunc.module import ModuleLoss
from sbfunc.per_sample._fallback import vmap_grads
from sbfunc.per_sample._intercept import LayerRecorder
from sbfunc.per_sample._layers import Contraction, ConvLayer
from sbfunc.per_sample._loss_hessian import draw_noise, element_weight, sampled_sqrt, sqrt_hessian
from sbfunc.per_sample._request import (
    Chunk,
    Curvature,
    check_curvature_output,
    chunks,
    curvature,  # noqa: F401  (the examples build requests)
)
from sbfunc.random import Key, check_key
from sbfunc.types import Params, PerSample

__all__ = ["cat_factors", "factor_chunks", "factor_iter", "transform"]

A = TypeVar("A")
B = TypeVar("B")


class _Linearized:
    """``<f_n, v_n>`` per sample: its per-sample gradient is ``J_n^T v_n``. The batch is
    ``(samples, v)``."""

    def __init__(self, loss_fn: ModuleLoss) -> None:
        self.loss_fn, self.module = loss_fn, loss_fn.module

    def __call__(self, params: Params, buffers: Params, batch: Any) -> torch.Tensor:
        out = self.loss_fn.forward(params, buffers, batch[0])
        return (out * batch[1]).flatten(1).sum(1)


def _spec_with_v(per_sample: PerSample) -> PerSample:
    if callable(per_sample):
        inner = per_sample
        return (lambda path, leaf: inner(path[1:], leaf), True)
    return (per_sample, True)


def _fallback(
    c: Curvature, params: Params, buffers: Params, batch: Any, names: list[str], v: torch.Tensor
) -> Params:
    r, m = v.shape[:2]
    repeated = take(batch, torch.arange(m).repeat(r), per_sample=c.per_sample)
    frozen = {k: t.detach() for k, t in params.items()}
    grads = vmap_grads(
        _Linearized(c.loss_fn),
        frozen,
        buffers,
        (repeated, v.flatten(0, 1)),
        names,
        per_sample=_spec_with_v(c.per_sample),
    )
    return {k: g.reshape(r, m, *g.shape[1:]) for k, g in grads.items()}


def _weight_factors(layer: Contraction | ConvLayer, g: torch.Tensor, r: int) -> torch.Tensor:
    """``[R, m, *weight_shape]`` from the output gradients ``g`` ``[R*m, *out]``."""
    m = g.shape[0] // r
    if isinstance(layer, ConvLayer):
        groups, o, positions = layer.groups, g.shape[1], g.shape[2:]
        folded = g.reshape(r, m, groups, o // groups, *positions).movedim(0, 2)
        w = layer._weight_backward(
            folded.reshape(1, -1, *positions),
            layer.x.reshape(1, -1, *layer.x.shape[2:]),
            m * groups,
        )
        w = w.reshape(m, groups, r, o // groups, *w.shape[1:]).movedim(2, 0)
        return w.reshape(r, m, *layer.weight_shape)
    go = layer.out_grad(g)
    w = torch.einsum("rntgo,ntgi->rngoi", go.reshape(r, m, *go.shape[1:]), layer.x)
    return w.reshape(r, m, *layer.weight_shape)


def _backward(out: torch.Tensor, edges: list[Any], v: torch.Tensor) -> Sequence[torch.Tensor]:
    """``J^T v`` to every edge, all ``R`` columns at once (a loop where torch cannot batch)."""
    with torch.enable_grad():
        try:
            return torch.autograd.grad(
                out, edges, v, retain_graph=True, is_grads_batched=True, materialize_grads=True
            )
        except RuntimeError:  # a backward formula without a batching rule
            cols = [
                torch.autograd.grad(out, edges, col, retain_graph=True, materialize_grads=True)
                for col in v
            ]
    return [torch.stack(list(g)) for g in zip(*cols, strict=True)]


def _chunk(
    c: Curvature,
    params: Params,
    buffers: Params,
    batch: Any,
    m: int,
    names: list[str],
    hessian: Callable[[torch.Tensor], torch.Tensor],
) -> Params:
    diff = {k: params[k].detach().requires_grad_() for k in names}
    with torch.enable_grad(), LayerRecorder({id(t): k for k, t in diff.items()}, m) as rec:
        out = c.loss_fn.forward({**params, **diff}, buffers, batch)
    check_curvature_output(c, out, m)
    v = hessian(out.detach())
    r = v.shape[0]
    covered = rec.covered()
    calls = [call for call in rec.calls if call.weight in covered or call.bias in covered]
    res: Params = {}
    if calls:
        grads: list[torch.Tensor | None] = list(_backward(out, [c.output for c in calls], v))
        for i, call in enumerate(calls):  # in call order, each [R, m, *out] freed once used
            g, grads[i] = grads[i], None
            assert g is not None
            layer, g = call.contraction, g.flatten(0, 1).detach()
            if call.weight in covered:
                res[call.weight] = _weight_factors(layer, g, r)
            if call.bias is not None and call.bias in covered:
                bias = layer.bias_grads(layer.out_grad(g))
                res[call.bias] = bias.reshape(r, m, *params[call.bias].shape)
    rest = [k for k in names if k not in res]
    if rest:
        res.update(_fallback(c, params, buffers, batch, rest, v))
    return {k: res[k] for k in names}


def factor_chunks(
    c: Curvature,
    params: Params,
    buffers: Params,
    batch: Any,
    *,
    subsampling: Any,
    chunk_size: int | None,
    key: Key | None,
) -> Iterator[Params]:
    """The factors ``{name: Tensor[R, m, *shape]}`` of each chunk of the selected samples, in
    order (``R``: the number of outputs per sample, or ``M``).

    Arguments are validated before the first chunk is computed.

    Args:
        c: the request (:func:`curvature`).
        params: parameters; never modified.
        buffers: buffers.
        batch: a pytree batch of ``N`` samples.
        subsampling: indices (:func:`select`) or ``None``.
        chunk_size: at most this many samples per chunk, or ``None``.
        key: the Monte-Carlo key (required when ``c.mc_samples`` is set, else unused).

    Returns:
        An iterator over the chunks' factor dicts.

    Raises:
        TypeError: for a bad key or indices.
        ValueError: for ``params``/``buffers`` that do not match the loss's module, a bad
            ``chunk_size``, indices or ``wrt`` names.

    Example:
        >>> model = torch.nn.Linear(3, 2)
        >>> c = curvature(sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy),
        ...               reduction="mean", mc_samples=None, wrt=None, per_sample=None)
        >>> batch = (torch.randn(5, 3), torch.zeros(5, dtype=torch.long))
        >>> parts = factor_chunks(c, *sbfunc.split_module(model), batch, subsampling=[4, 0, 0],
        ...                       chunk_size=2, key=None)
        >>> [tuple(f["weight"].shape) for f in parts]
        [(2, 2, 2, 3), (2, 1, 2, 3)]
    """
    if c.mc_samples is not None:
        key = check_key(key, "key")
    names, parts = chunks(c, params, buffers, batch, subsampling, chunk_size)
    return factor_iter(c, params, buffers, names, parts, key)


def factor_iter(
    c: Curvature,
    params: Params,
    buffers: Params,
    names: list[str],
    parts: list[Chunk],
    key: Key | None,
) -> Iterator[Params]:
    """The factors of the given chunks (validated by :func:`factor_chunks`), one at a time."""
    noise: list[torch.Tensor] = []
    for part in parts:

        def hessian(out: torch.Tensor, part: Chunk = part) -> torch.Tensor:
            weight = element_weight(c.kind, out, part.n, c.reduction)
            if c.mc_samples is None:
                return sqrt_hessian(c.kind, out, weight)
            if not noise:
                assert key is not None
                noise.append(draw_noise(c.kind, key, c.mc_samples, out, part.s))
            return sampled_sqrt(c.kind, out, weight, noise[0][:, part.start : part.start + part.m])

        yield _chunk(c, params, buffers, part.batch, part.m, names, hessian)


def cat_factors(parts: list[Params]) -> Params:
    """The chunks' factors ``[R, m, *shape]`` joined along the sample axis.

    Args:
        parts: the chunks' factor dicts, in order.

    Returns:
        ``{name: Tensor[R, S, *shape]}``.

    Example:
        >>> cat_factors([{"w": torch.zeros(2, 1, 3)}, {"w": torch.ones(2, 2, 3)}])["w"].shape
        torch.Size([2, 3, 3])

    References:
        Dangel et al. 2020, "BackPACK" (``[C, N, *shape]`` layout of ``sqrt_ggn_exact``).
    """
    if len(parts) == 1:
        return parts[0]
    return {k: torch.cat([p[k] for p in parts], dim=1) for k in parts[0]}


def transform(
    c: Curvature,
    per_chunk: Callable[[Params], A],
    combine: Callable[[list[A]], B],
) -> Callable[..., B]:
    """``f(params, buffers, batch, *, subsampling=None, chunk_size=None, key=None)``: the
    factors of each chunk reduced by ``per_chunk`` (as soon as they are computed, so only one
    chunk's factors are alive), the chunks' results joined by ``combine``.

    Args:
        c: the request (:func:`curvature`).
        per_chunk: ``{name: Tensor[R, m, *shape]} -> result`` of one chunk.
        combine: the chunks' results (in order) to the final result.

    Returns:
        The transform (``key`` is required when ``c.mc_samples`` is set).

    Example:
        >>> model = torch.nn.Linear(3, 2)
        >>> c = curvature(sbfunc.per_sample_loss(model, torch.nn.functional.mse_loss),
        ...               reduction="sum", mc_samples=None, wrt=None, per_sample=None)
        >>> count = transform(c, lambda f: {"n": torch.tensor(f["bias"].shape[1])},
        ...                   lambda parts: {"n": sum(p["n"] for p in parts)})
        >>> count(*sbfunc.split_module(model), (torch.ones(5, 3), torch.ones(5, 2)),
        ...       chunk_size=2)
        {'n': tensor(5)}
    """

    def f(
        params: Params,
        buffers: Params,
        batch: Any,
        /,
        *,
        subsampling: Sequence[int] | torch.Tensor | None = None,
        chunk_size: int | None = None,
        key: Key | None = None,
    ) -> B:
        parts = factor_chunks(
            c, params, buffers, batch, subsampling=subsampling, chunk_size=chunk_size, key=key
        )
        return combine([per_chunk(p) for p in parts])

    return f
