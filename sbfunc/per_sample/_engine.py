"""The shared driver of the per-sample transforms: validate, sub-sample, chunk, compute, combine.

Per chunk of the selected samples, one forward runs under a
:class:`~sbfunc.per_sample._intercept.LayerRecorder`; one backward of ``losses.sum()`` to the
recorded layer outputs gives every covered Linear/Conv parameter's quantities from the layer
identities (:mod:`sbfunc.per_sample`); the other parameters go through ``vmap(grad)``
(:func:`~sbfunc.per_sample._fallback.vmap_grads`, or a per-sample loop where torch cannot vmap
the loss) with the covered ones held constant.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch

from sbfunc.batch import batch_size, take
from sbfunc.module import check_state, reduce_per_sample
from sbfunc.per_sample._fallback import vmap_grads
from sbfunc.per_sample._intercept import LayerRecorder
from sbfunc.types import LossFn, Params, PerSample
from sbfunc.validation import check_int

__all__ = ["Stat", "check_subsampling", "check_wrt", "compute", "resolve_wrt"]

Stat = Literal["grad", "sq_norm", "sum", "sum_sq"]
_PER_SAMPLE: frozenset[str] = frozenset({"grad", "sq_norm"})

# How each statistic follows from materialized per-sample gradients ``g[N, *shape]``.
_FROM_GRADS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "grad": lambda g: g,
    "sq_norm": lambda g: g.square().reshape(g.shape[0], -1).sum(1),
    "sum": lambda g: g.sum(0),
    "sum_sq": lambda g: g.square().sum(0),
}
# ... and the layer method giving it for a covered Linear/Conv weight.
_WEIGHT_METHOD = {
    "grad": "weight_grads",
    "sq_norm": "weight_sq_norms",
    "sum": "weight_sum",
    "sum_sq": "weight_sum_sq",
}


def check_wrt(wrt: Sequence[str] | None) -> tuple[str, ...] | None:
    """Validate ``wrt``: ``None`` (all parameters) or a non-empty sequence of names/prefixes.

    Args:
        wrt: ``None`` or parameter names / module prefixes.

    Returns:
        ``None`` or the names as a tuple.

    Raises:
        TypeError: for a bare string or a non-sequence.
        ValueError: for an empty sequence or empty names.

    Example:
        >>> check_wrt(["0", "1.bias"])
        ('0', '1.bias')
    """
    if wrt is None:
        return None
    if isinstance(wrt, str) or not isinstance(wrt, Sequence):
        raise TypeError(f"wrt must be None or a list of parameter names, got {wrt!r}")
    if not wrt or not all(isinstance(w, str) and w for w in wrt):
        raise ValueError(f"wrt must be a non-empty list of non-empty names, got {list(wrt)!r}")
    return tuple(wrt)


def resolve_wrt(wrt: Sequence[str] | None, params: Params) -> list[str]:
    """Parameter names selected by ``wrt`` (exact names or module prefixes), in params order.

    Args:
        wrt: ``None`` (every parameter) or names / prefixes (``"0"`` selects ``"0.weight"``).
        params: the parameter dict.

    Returns:
        The selected names.

    Raises:
        ValueError: if an entry matches no parameter (the message lists the names).

    Example:
        >>> resolve_wrt(["0"], {"0.weight": torch.ones(1), "0.bias": torch.ones(1),
        ...                     "1.weight": torch.ones(1)})
        ['0.weight', '0.bias']
    """
    if wrt is None:
        return list(params)

    def matches(name: str, w: str) -> bool:
        return name == w or name.startswith(w + ".")

    for w in wrt:
        if not any(matches(name, w) for name in params):
            raise ValueError(f"wrt entry {w!r} matches no parameter; parameters: {list(params)}")
    return [name for name in params if any(matches(name, w) for w in wrt)]


def _valid_int_list(values: Any, n: int) -> bool:
    return (
        isinstance(values, list | tuple)
        and len(values) > 0
        and all(type(i) is int for i in values)
        and min(values) >= 0
        and max(values) < n
    )


def check_subsampling(subsampling: Any, n: int) -> torch.Tensor:
    """Validate sub-sampling indices against a batch of ``n`` and return them as int64, in the
    given order with repeats kept (BackPACK's ``subsampling``: row ``i`` of a result is sample
    ``subsampling[i]``; a repeated index is computed, and counted in sums, once per position).

    A Python list is checked in Python; a tensor is read on the host (one sync for the range
    check). This runs once per call of a per-sample transform, outside the training step's
    hot path.

    Args:
        subsampling: a list/tuple of ints or a 1-D integer tensor.
        n: the batch size.

    Returns:
        ``Tensor[S]`` of int64 indices, in the given order.

    Raises:
        TypeError: if the indices are not integers.
        ValueError: if they are not 1-D, empty, or one lies outside ``[0, n)`` (the message
            names its position, its value and the batch size).

    Example:
        >>> check_subsampling([3, 0, 3], 5)
        tensor([3, 0, 3])
        >>> check_subsampling([1, 5], 5)
        Traceback (most recent call last):
        ...
        ValueError: subsampling[1] = 5 is out of range for a batch of 5 samples: ...
    """
    if _valid_int_list(subsampling, n):  # a Python list: validated without tensor ops
        return torch.tensor(subsampling, dtype=torch.long)
    idx = torch.as_tensor(subsampling)
    if idx.dim() != 1 or idx.numel() == 0:
        raise ValueError(
            f"subsampling must be a non-empty 1-D list of indices, got shape {tuple(idx.shape)}"
        )
    if idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool:
        raise TypeError(f"subsampling must hold integer indices, got dtype {idx.dtype}")
    idx = idx.long()
    bad = ((idx < 0) | (idx >= n)).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        raise ValueError(
            f"subsampling[{i}] = {int(idx[i])} is out of range for a batch of {n} samples: "
            f"indices must be in [0, {n}) (order and repeats are kept)"
        )
    return idx


def _chunk(
    loss_fn: LossFn,
    params: Params,
    buffers: Params,
    batch: Any,
    names: list[str],
    stats: tuple[Stat, ...],
    n: int,
    per_sample: PerSample,
) -> dict[str, Params]:
    diff = {k: params[k].detach().requires_grad_() for k in names}
    with torch.enable_grad(), LayerRecorder({id(v): k for k, v in diff.items()}, n) as rec:
        losses = reduce_per_sample(loss_fn({**params, **diff}, buffers, batch), n)
    covered = rec.covered()
    calls = [c for c in rec.calls if c.weight in covered or c.bias in covered]
    out: dict[str, Params] = {stat: {} for stat in stats}
    if calls:
        with torch.enable_grad():
            grads = torch.autograd.grad(
                losses.sum(), [c.output for c in calls], allow_unused=True, materialize_grads=True
            )
        for call, g in zip(calls, grads, strict=True):
            layer = call.contraction
            g = layer.out_grad(g.detach())
            bias = layer.bias_grads(g) if call.bias in covered else None
            for stat in stats:
                if call.weight in covered:
                    out[stat][call.weight] = getattr(layer, _WEIGHT_METHOD[stat])(g)
                if bias is not None and call.bias is not None:
                    out[stat][call.bias] = _FROM_GRADS[stat](bias)
    rest = [k for k in names if k not in out[stats[0]]]
    if rest:
        frozen = {k: v.detach() for k, v in params.items()}
        for k, g in vmap_grads(
            loss_fn, frozen, buffers, batch, rest, per_sample=per_sample
        ).items():
            for stat in stats:
                out[stat][k] = _FROM_GRADS[stat](g)
    return {stat: {k: out[stat][k] for k in names} for stat in stats}


def compute(
    loss_fn: LossFn,
    params: Params,
    buffers: Params,
    batch: Any,
    *,
    wrt: Sequence[str] | None,
    stats: tuple[Stat, ...],
    subsampling: Any,
    chunk_size: int | None,
    per_sample: PerSample = None,
) -> dict[str, Params]:
    """Statistics of the per-sample gradients of the selected samples, per stat and parameter.

    Per-sample statistics (``grad``, ``sq_norm``) have the selected samples as leading
    dimension, in the order of ``subsampling`` (repeats kept); sums (``sum``, ``sum_sq``) are
    over them (a repeated index counts once per position).

    Args:
        loss_fn: per-sample loss function.
        params: parameters (differentiated: those selected by ``wrt``).
        buffers: buffers.
        batch: pytree batch.
        wrt: validated ``wrt`` (see :func:`check_wrt`).
        stats: the statistics to compute in one pass.
        subsampling: indices (see :func:`check_subsampling`) or ``None``.
        chunk_size: samples per forward/backward, or ``None`` for all at once.
        per_sample: which leaves of the batch are per-sample (:data:`sbfunc.types.PerSample`).

    Returns:
        ``{stat: {name: Tensor}}``.

    Raises:
        ValueError: for ``params``/``buffers`` that do not match the module behind a
            :class:`~sbfunc.module.ModuleLoss` (checked first, before any forward), a bad
            ``chunk_size``, unknown ``wrt`` names, bad indices, a loss that is not ``[N]`` or
            train-mode BatchNorm.

    Example:
        >>> model = torch.nn.Linear(3, 2)
        >>> loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.mse_loss)
        >>> params, buffers = sbfunc.split_module(model)
        >>> batch = (torch.ones(6, 3), torch.zeros(6, 2))
        >>> out = compute(loss_fn, params, buffers, batch, wrt=None, stats=("grad",),
        ...               subsampling=[0, 5], chunk_size=1)
        >>> {k: tuple(v.shape) for k, v in out["grad"].items()}
        {'weight': (2, 2, 3), 'bias': (2, 2)}

    References:
        Dangel et al. 2020, "BackPACK: Packing more into backprop".
    """
    check_state(loss_fn, params, buffers)
    if chunk_size is not None:
        check_int(chunk_size, "chunk_size", low=1, fix="or None for one chunk")
    names = resolve_wrt(wrt, params)
    n = batch_size(batch, per_sample=per_sample)
    idx = None
    if subsampling is not None:
        idx = check_subsampling(subsampling, n)
        n = idx.numel()
    if chunk_size is None or chunk_size >= n:
        pieces = [(batch if idx is None else take(batch, idx, per_sample=per_sample), n)]
    else:
        rows = idx if idx is not None else torch.arange(n)
        pieces = [
            (take(batch, part, per_sample=per_sample), part.numel())
            for part in rows.split(chunk_size)
        ]
    results = [_chunk(loss_fn, params, buffers, b, names, stats, m, per_sample) for b, m in pieces]
    if len(results) == 1:
        return results[0]
    return {stat: _combine([r[stat] for r in results], stat, names) for stat in stats}


def _combine(parts: list[Params], stat: Stat, names: list[str]) -> Params:
    if stat in _PER_SAMPLE:
        return {k: torch.cat([p[k] for p in parts]) for k in names}
    return {k: torch.stack([p[k] for p in parts]).sum(0) for k in names}
