"""Per-sample gradients for the parameters the layer identities do not cover.

``vmap(grad)`` first; where torch cannot vmap the loss (``nn.RNN``/``nn.GRU`` and ``nn.LSTM``
in float64 on CPU, data-dependent control flow as in Hugging Face attention masks, ``.item()``,
...), a loop of per-sample ``torch.autograd.grad`` calls, with a :class:`VmapFallbackWarning`
that names the module that failed and torch's reason.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.func import grad, vmap

from sbfunc._rows import walk
from sbfunc.batch import batch_size, take
from sbfunc.module import reduce_per_sample
from sbfunc.per_sample._intercept import BATCH_NORM_HELP
from sbfunc.types import LossFn, Params, PerSample

__all__ = ["VmapFallbackWarning", "loop_grads", "vmap_grads"]

# Substrings of torch's errors for train-mode BatchNorm under vmap/grad (running statistics
# updated in place, or captured by the transform).
_BATCH_NORM_HINTS = ("batch norm", "running_mean", "mutate a captured tensor")


class VmapFallbackWarning(UserWarning):
    """Per-sample gradients fell back from ``vmap(grad)`` to a loop over the samples: correct,
    but one forward and backward per sample. The message names the module and torch's reason.

    Silence it with ``warnings.filterwarnings("ignore", category=VmapFallbackWarning)``.

    Example:
        >>> from sbfunc.per_sample import VmapFallbackWarning
        >>> issubclass(VmapFallbackWarning, UserWarning)
        True
    """


def _tensor_rows(batch: Any, per_sample: PerSample) -> list[torch.Tensor]:
    rows: list[torch.Tensor] = []

    def collect(path: tuple[Any, ...], leaf: Any, size: int | None) -> Any:
        if size is not None and isinstance(leaf, torch.Tensor):
            rows.append(leaf)
        return leaf

    walk(batch, per_sample, collect, rebuild=False)
    return rows


def vmap_grads(
    loss_fn: LossFn,
    params: Params,
    buffers: Params,
    batch: Any,
    names: Sequence[str],
    *,
    per_sample: PerSample = None,
) -> Params:
    """Per-sample gradients of ``loss_fn`` w.r.t. ``params[name]`` for ``name in names``.

    Each sample is run as a batch of one (its per-sample tensor leaves unsqueezed), the other
    parameters are constants. Only the per-sample tensor leaves are vmapped; metadata and
    host-side per-sample leaves (lists, NumPy arrays, which ``vmap`` cannot split) are closed
    over whole, so any pytree batch works as long as the loss reads its per-sample values from
    tensors (as :func:`sbfunc.per_sample_loss` does). When ``vmap`` fails for another reason
    than train-mode BatchNorm, the gradients come from :func:`loop_grads` after a
    :class:`VmapFallbackWarning`.

    Args:
        loss_fn: per-sample loss function.
        params: all parameters.
        buffers: buffers.
        batch: pytree batch of ``N`` samples.
        names: parameters to differentiate.
        per_sample: which leaves of the batch are per-sample (:data:`sbfunc.types.PerSample`).

    Returns:
        ``{name: Tensor[N, *shape]}``.

    Raises:
        ValueError: for batch normalization in train mode (torch's vmap error, explained).

    Example:
        >>> def loss_fn(params, buffers, batch):
        ...     return torch.sin(batch * params["a"]).sum(1)
        >>> vmap_grads(loss_fn, {"a": torch.zeros(())}, {}, torch.ones(4, 2), ["a"])["a"]
        tensor([2., 2., 2., 2.])

    References:
        torch.func per-sample-gradients tutorial (``vmap(grad(...))``).
    """
    diff = {k: params[k] for k in names}

    def one(diff: Params, sample_rows: list[torch.Tensor]) -> torch.Tensor:
        rows = iter(sample_rows)

        def put(path: tuple[Any, ...], leaf: Any, size: int | None) -> Any:
            is_row = size is not None and isinstance(leaf, torch.Tensor)
            return next(rows).unsqueeze(0) if is_row else leaf

        sample = walk(batch, per_sample, put, rebuild=True)
        losses = loss_fn({**params, **diff}, buffers, sample)
        return reduce_per_sample(losses, 1)[0]

    try:
        out: Params = vmap(grad(one), in_dims=(None, 0))(diff, _tensor_rows(batch, per_sample))
        return out
    except RuntimeError as err:
        message = str(err).lower()
        if any(hint in message for hint in _BATCH_NORM_HINTS):
            raise ValueError(
                "the loss function failed under vmap, most likely because of BatchNorm in "
                f"train mode (torch says: {err}); {BATCH_NORM_HELP}"
            ) from err
        which = (
            ", ".join(names) if len(names) <= 3 else f"{len(names)} parameters ({names[0]}, ...)"
        )
        warnings.warn(
            f"per-sample gradients of {which} fall back to a loop over the samples (slower, "
            f"same result): torch.func.vmap failed in {_culprit(err, loss_fn)} with: "
            f"{_first_line(err)}",
            VmapFallbackWarning,
            stacklevel=2,
        )
    return loop_grads(loss_fn, params, buffers, batch, names, per_sample=per_sample)


def loop_grads(
    loss_fn: LossFn,
    params: Params,
    buffers: Params,
    batch: Any,
    names: Sequence[str],
    *,
    per_sample: PerSample = None,
) -> Params:
    """Per-sample gradients by one ``torch.autograd.grad`` per sample (a batch of one each).

    Works for any loss whose samples do not interact (recurrent layers, data-dependent control
    flow, ops without a vmap rule), at the cost of ``N`` forwards and backwards.

    Args:
        loss_fn, params, buffers, batch, names, per_sample: as for :func:`vmap_grads`.

    Returns:
        ``{name: Tensor[N, *shape]}`` (zeros for a parameter a sample's loss does not use).

    Example:
        >>> def loss_fn(params, buffers, batch):
        ...     return (batch * params["a"]).square().sum(1)
        >>> loop_grads(loss_fn, {"a": torch.ones(())}, {}, torch.arange(3.0)[:, None], ["a"])
        {'a': tensor([0., 2., 8.])}

    References:
        Goodfellow 2015, "Efficient per-example gradient computations" (the naive loop it
        improves on); PyTorch ``torch.autograd.grad``.
    """
    rows = torch.arange(batch_size(batch, per_sample=per_sample))
    out: dict[str, list[torch.Tensor]] = {k: [] for k in names}
    for i in range(rows.numel()):
        sample = take(batch, rows[i : i + 1], per_sample=per_sample)
        diff = {k: params[k].detach().requires_grad_() for k in names}
        with torch.enable_grad():
            loss = reduce_per_sample(loss_fn({**params, **diff}, buffers, sample), 1)[0]
            grads = torch.autograd.grad(
                loss, list(diff.values()), allow_unused=True, materialize_grads=True
            )
        for k, g in zip(names, grads, strict=True):
            out[k].append(g)
    return {k: torch.stack(v) for k, v in out.items()}


def _first_line(err: BaseException) -> str:
    line = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return line if len(line) <= 200 else line[:197] + "..."


def _culprit(err: BaseException, loss_fn: LossFn) -> str:
    """The innermost ``nn.Module`` running when ``err`` was raised (from its traceback), named
    inside ``loss_fn.module`` when the loss was built by :func:`sbfunc.per_sample_loss`."""
    innermost = None
    tb = err.__traceback__
    while tb is not None:
        obj = tb.tb_frame.f_locals.get("self")
        if isinstance(obj, nn.Module):
            innermost = obj
        tb = tb.tb_next
    if innermost is None:
        return f"the loss function {getattr(loss_fn, '__qualname__', type(loss_fn).__name__)}"
    root = getattr(loss_fn, "module", None)
    names = {id(m): n for n, m in root.named_modules()} if isinstance(root, nn.Module) else {}
    name = names.get(id(innermost))
    where = "the model" if name == "" else f"{name!r}" if name else "module"
    return f"{where} ({type(innermost).__name__})"
