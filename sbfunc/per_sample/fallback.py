"""Per-sample gradients by ``vmap(grad)`` for parameters the layer identities do not cover."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import optree
import torch
from torch.func import grad, vmap

from sbfunc.batch import _is_per_sample
from sbfunc.module import LossFn, Params, reduce_per_sample
from sbfunc.per_sample.intercept import BATCH_NORM_HELP

__all__ = ["vmap_grads"]

# Substrings of torch's errors for train-mode BatchNorm under vmap/grad (running statistics
# updated in place, or captured by the transform).
_BATCH_NORM_HINTS = ("batch norm", "running_mean", "mutate a captured tensor")


def vmap_grads(
    loss_fn: LossFn, params: Params, buffers: Params, batch: Any, names: Sequence[str]
) -> Params:
    """Per-sample gradients of ``loss_fn`` w.r.t. ``params[name]`` for ``name in names``.

    Each sample is run as a batch of one (its per-sample leaves unsqueezed), the other
    parameters are constants. Only the per-sample leaves of the batch are vmapped; metadata
    leaves are closed over, so any optree pytree batch works.

    Args:
        loss_fn: per-sample loss function.
        params: all parameters.
        buffers: buffers.
        batch: pytree batch of ``N`` samples.
        names: parameters to differentiate.

    Returns:
        ``{name: Tensor[N, *shape]}``.

    Raises:
        ValueError: for batch normalization in train mode (torch's vmap error, explained).

    Example:
        >>> from sbfunc.per_sample.fallback import vmap_grads
        >>> def loss_fn(params, buffers, batch):
        ...     return torch.sin(batch * params["a"]).sum(1)
        >>> vmap_grads(loss_fn, {"a": torch.zeros(())}, {}, torch.ones(4, 2), ["a"])["a"]
        tensor([2., 2., 2., 2.])

    References:
        torch.func per-sample-gradients tutorial (``vmap(grad(...))``).
    """
    leaves, spec = optree.tree_flatten(batch)
    rows = [i for i, leaf in enumerate(leaves) if _is_per_sample(leaf)]
    diff = {k: params[k] for k in names}

    def one(diff: Params, sample_rows: list[torch.Tensor]) -> torch.Tensor:
        sample = list(leaves)
        for i, row in zip(rows, sample_rows, strict=True):
            sample[i] = row.unsqueeze(0)
        losses = loss_fn({**params, **diff}, buffers, optree.tree_unflatten(spec, sample))
        return reduce_per_sample(losses, 1)[0]

    try:
        out: Params = vmap(grad(one), in_dims=(None, 0))(diff, [leaves[i] for i in rows])
    except RuntimeError as err:
        message = str(err).lower()
        if any(hint in message for hint in _BATCH_NORM_HINTS):
            raise ValueError(
                "the loss function failed under vmap, most likely because of BatchNorm in "
                f"train mode (torch says: {err}); {BATCH_NORM_HELP}"
            ) from err
        raise
    return out
