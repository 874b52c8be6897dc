"""Sharpness-aware minimisation: the update uses the gradient at an adversarially nudged point."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from sbfunc import random as sbrandom
from sbfunc._gradients import differentiate, fresh_buffers, weighted_mean
from sbfunc.engine import Algorithm, Context, Event
from sbfunc.module import ModuleLoss, check_loss_fn, draws_randomness
from sbfunc.types import LossFn, Params
from sbfunc.validation import check_bool, check_int, check_real

__all__ = ["SAM", "sam_gradients"]


def sam_gradients(
    loss_fn: LossFn,
    params: Params,
    buffers: Params,
    batch: Any,
    grads: Params,
    *,
    rho: float = 0.05,
    epsilon: float = 1e-12,
    sample_weights: torch.Tensor | None = None,
    key: sbrandom.Key | None = None,
) -> Params:
    """The SAM gradient: the gradient of the batch loss at ``params + rho * g / ||g||``.

    ``g`` is ``grads`` (the ordinary gradient at ``params``) and ``||g||`` its global L2 norm
    (plus ``epsilon``). The loss is ``weighted_mean(loss_fn(p, buffers, batch),
    sample_weights)``, as in the training step. Buffer changes of this second forward
    (BatchNorm statistics) are discarded, and under ``key`` the model's random operations
    (dropout) draw from it (:func:`sbfunc.random.keyed`). With ``rho = 0`` and a deterministic
    ``loss_fn``, the result is the gradient at ``params``.

    Args:
        loss_fn: the per-sample training loss ``(params, buffers, batch) -> Tensor[N]``.
        params: the parameters (not changed).
        buffers: the buffers (not changed).
        batch: the rows to differentiate on.
        grads: the gradient at ``params``, by parameter name.
        rho: the radius of the neighbourhood, ``>= 0``.
        epsilon: added to the norm, ``>= 0``.
        sample_weights: per-row loss weights, or ``None``.
        key: a key for the model's random operations, or ``None`` (torch's own generator).

    Returns:
        The gradients at the perturbed point, by parameter name.

    Example:
        >>> from sbfunc.algorithms import sam_gradients
        >>> def loss_fn(p, b, batch):  # per-sample losses (w . x) ** 2 / 2
        ...     return (batch @ p["w"]) ** 2 / 2
        >>> params, batch = {"w": torch.tensor([1.0, 0.0])}, torch.eye(2)
        >>> grads = {"w": torch.tensor([0.5, 0.0])}  # the plain gradient
        >>> sam_gradients(loss_fn, params, {}, batch, grads, rho=0.5)["w"]
        tensor([0.7500, 0.0000])

    References:
        Foret et al. 2021, "Sharpness-Aware Minimization for Efficiently Improving
        Generalization"; MosaicML Composer ``SAMOptimizer``.
    """
    norms = torch._foreach_norm(list(grads.values()))
    norm = torch.linalg.vector_norm(torch.stack(norms))
    scale = rho / (norm + epsilon)
    perturbed = {k: p + grads[k] * scale.to(p.dtype) for k, p in params.items()}

    def objective(p: Params) -> tuple[torch.Tensor, tuple[()]]:
        randomness = contextlib.nullcontext() if key is None else sbrandom.keyed(key)
        with randomness:
            losses = loss_fn(p, fresh_buffers(buffers), batch)
        return weighted_mean(losses, sample_weights), ()

    return differentiate(objective, perturbed)[0]


class SAM(Algorithm):
    """Replace the step's gradient by the SAM gradient on ``AFTER_BACKWARD``.

    Every ``interval`` steps (when ``(time.step + 1) % interval == 0``, decided on the host, as
    in Composer), ``apply`` computes :func:`sam_gradients` with its own ``loss_fn`` on
    ``state.batch`` (the kept rows, after Selective Backprop) with ``state.sample_weights``,
    and the optimizer updates with it. The second forward-backward doubles the cost of those
    steps. Composer wraps the optimizer instead (``SAMOptimizer``); the update is the same,
    except that the second forward's BatchNorm statistics are not kept here.

    Args:
        rho: the neighbourhood radius, ``>= 0`` (``0`` changes nothing).
        epsilon: added to the gradient norm, ``>= 0``.
        interval: run every ``interval`` steps, ``>= 1``.
        loss_fn: the per-sample training loss (usually the one given to the step).
        keyed: draw the model's random operations of the second forward from this
            algorithm's key; ``None`` (default) does so when ``loss_fn`` is a
            :func:`sbfunc.per_sample_loss` of a module with random layers.

    Example:
        >>> from sbfunc.algorithms import SAM
        >>> model = torch.nn.Linear(2, 2)
        >>> loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy,
        ...                                  mode="train")
        >>> step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1),
        ...                               [SAM(rho=0.05, loss_fn=loss_fn)])
        >>> state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))
        >>> state, metrics = step(state, (torch.randn(4, 2), torch.tensor([0, 1, 0, 1])))
        >>> metrics.traces[0].name, metrics.traces[0].event.name
        ('SAM', 'AFTER_BACKWARD')

    References:
        Foret et al. 2021; MosaicML Composer ``SAM``.
    """

    def __init__(
        self,
        rho: float = 0.05,
        epsilon: float = 1e-12,
        interval: int = 1,
        *,
        loss_fn: LossFn,
        keyed: bool | None = None,
    ) -> None:
        self.rho = check_real(rho, "rho", low=0.0)
        self.epsilon = check_real(epsilon, "epsilon", low=0.0)
        self.interval = check_int(interval, "interval", low=1)
        self.loss_fn = check_loss_fn(loss_fn)
        if keyed is None:
            keyed = isinstance(loss_fn, ModuleLoss) and draws_randomness(loss_fn.module)
        self.keyed = check_bool(keyed, "keyed")

    events = frozenset({Event.AFTER_BACKWARD})

    def match(self, event: Event, ctx: Context) -> bool:
        return event == Event.AFTER_BACKWARD and (ctx.time.step + 1) % self.interval == 0

    def apply(self, event: Event, ctx: Context) -> Context:
        if ctx.grads is None:
            raise RuntimeError(f"{self.name}: AFTER_BACKWARD without gradients")
        grads = sam_gradients(
            self.loss_fn,
            ctx.params,
            ctx.buffers,
            ctx.batch,
            ctx.grads,
            rho=self.rho,
            epsilon=self.epsilon,
            sample_weights=ctx.sample_weights,
            key=ctx.key if self.keyed else None,
        )
        return ctx.replace(grads=grads)

    def __repr__(self) -> str:
        return f"SAM(rho={self.rho}, epsilon={self.epsilon}, interval={self.interval})"
