"""Differentiation for the training step: one objective, the fastest transform for each mode.

Eagerly, :func:`differentiate` runs the objective on detached leaves that require grad and
calls ``torch.autograd.grad``: the same forward and backward as a plain PyTorch loop, without
torch.func's per-operation overhead. While ``torch.compile`` traces the step it uses
``torch.func.grad_and_value`` (the transform the compiler supports; ``torch.autograd.grad``
breaks the graph). Both compute the same gradients with the same formulas; neither mutates
its inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import optree
import torch
import torch.utils._pytree as torch_pytree
from torch.func import grad_and_value

from sbfunc._tracing import tracing
from sbfunc.types import Params

__all__ = [
    "check_losses",
    "detach_tensors",
    "differentiate",
    "fresh_buffers",
    "weighted_mean",
]


def weighted_mean(losses: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """``mean(weights * losses)`` over the rows (plain mean without weights).

    Selection policies return importance weights normalised for this estimator: the weighted
    mean over the kept rows estimates the mean loss over the whole batch.

    Example:
        >>> sbfunc.step.weighted_mean(torch.tensor([1.0, 3.0]), torch.tensor([2.0, 0.0]))
        tensor(1.)

    References:
        Horvitz and Thompson 1952 (inverse-probability weights); Katharopoulos and Fleuret
        2018, "Not All Samples Are Created Equal" (unbiased importance-sampled SGD).
    """
    if weights is None:
        return losses.mean()
    if weights.shape != losses.shape:
        raise ValueError(
            f"sample_weights of shape {tuple(weights.shape)} do not match the per-sample losses "
            f"of shape {tuple(losses.shape)}; a selection must weight exactly its kept rows"
        )
    return (weights.to(losses.dtype) * losses).mean()


def fresh_buffers(buffers: Params, constants: Collection[str] = ()) -> Params:
    """Copies of the buffers for one forward: train-mode BatchNorm writes its running
    statistics into the buffers it is given, and the caller's must never change. The entries
    named in ``constants`` (frozen parameters, which no forward writes) are passed as they
    are: a frozen base is never copied."""
    if not buffers:
        return buffers
    return {k: v if k in constants else v.clone() for k, v in buffers.items()}


class _Static:
    """A pytree node without children whose context is the non-tensor part of an aux value:
    ``torch.func`` accepts only tensor leaves in ``has_aux`` outputs."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


torch_pytree.register_pytree_node(
    _Static,
    lambda s: ([], s.value),
    lambda _, ctx: _Static(ctx),
    serialized_type_name="sbfunc",
)


def _split(tree: Any) -> tuple[tuple[torch.Tensor, ...], _Static]:
    # torch's own pytree, not optree: the compiler traces it natively (optree breaks graphs).
    leaves, spec = torch_pytree.tree_flatten(tree)
    # The tensors' places by index, not by a sentinel object compared with ``is``: torch
    # 2.11's dynamo fails on ``SymInt is object()`` (an int leaf that became dynamic).
    slots = tuple(i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor))
    static = tuple(None if isinstance(x, torch.Tensor) else x for x in leaves)
    return tuple(leaves[i] for i in slots), _Static((spec, static, slots))


def _join(tensors: tuple[torch.Tensor, ...], static: _Static) -> Any:
    spec, leaves, slots = static.value
    out = list(leaves)
    for i, t in zip(slots, tensors, strict=True):
        out[i] = t
    return torch_pytree.tree_unflatten(out, spec)


def differentiate(
    objective: Callable[[Params], tuple[torch.Tensor, Any]],
    params: Params,
    *,
    detach_aux: bool = True,
) -> tuple[Params, torch.Tensor, Any]:
    """Gradients of ``objective(params) -> (loss, aux)`` w.r.t. every entry of ``params``.

    Args:
        objective: a pure function of the parameter dict returning a 0-d loss and any
            auxiliary pytree (returned detached).
        params: the parameters (never mutated; their ``requires_grad`` is not touched).
        detach_aux: detach every tensor of the aux eagerly (``False``: the caller detaches
            what may carry autograd history; while compiling, aux is always detached).

    Returns:
        ``(grads, loss, aux)``: a dict like ``params`` (zeros for unused entries), the detached
        loss and the detached aux.

    Example:
        >>> grads, loss, aux = differentiate(lambda p: ((p["w"] ** 2).sum(), p["w"] * 2),
        ...                                  {"w": torch.tensor([1.0, -2.0])})
        >>> grads["w"], loss, aux
        (tensor([ 2., -4.]), tensor(5.), tensor([ 2., -4.]))

    References:
        PyTorch ``torch.autograd.grad``; ``torch.func.grad_and_value`` and the torch.compile
        FAQ (function transforms under the compiler).
    """
    if tracing():

        def tensors_only(p: Params) -> tuple[torch.Tensor, Any]:
            loss, aux = objective(p)
            return loss, _split(aux)

        grads, (loss, parts) = grad_and_value(tensors_only, has_aux=True)(params)
        return grads, loss, _join(*parts)
    leaves = {k: v.detach().requires_grad_() for k, v in params.items()}
    loss, aux = objective(leaves)
    raw: tuple[torch.Tensor | None, ...] = (None,) * len(leaves)
    if loss.requires_grad:  # a loss that no parameter reaches has zero gradients
        raw = torch.autograd.grad(loss, tuple(leaves.values()), allow_unused=True)
    grads = {
        k: torch.zeros_like(v) if g is None else g
        for (k, v), g in zip(leaves.items(), raw, strict=True)
    }
    return grads, loss.detach(), detach_tensors(aux) if detach_aux else aux


def detach_tensors(tree: Any) -> Any:
    """``tree`` with every tensor leaf detached (a bare tensor: detached directly)."""
    if isinstance(tree, torch.Tensor):
        return tree.detach()
    return optree.tree_map(
        lambda x: x.detach() if isinstance(x, torch.Tensor) else x, tree, none_is_leaf=True
    )


def check_losses(losses: Any, n: int) -> None:
    """Raise unless ``losses`` is a ``Tensor[n]`` (one loss per sample of the batch)."""
    if not isinstance(losses, torch.Tensor) or losses.dim() != 1 or losses.shape[0] != n:
        got = (
            f"shape {tuple(losses.shape)}"
            if isinstance(losses, torch.Tensor)
            else type(losses).__name__
        )
        raise ValueError(
            f"loss_fn must return one loss per sample, a Tensor[{n}] for this batch of {n} "
            f"rows; got {got}. Use sbfunc.per_sample_loss, or a criterion with "
            "reduction='none'"
        )
