"""RMSprop's rescaling (:func:`scale_by_rms`): the updates divided by the root of an
exponential moving average of their squares, with optax's definition."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch

from sbfunc.optim._base import (
    GradientTransformation,
    TransformRecord,
    by_group,
    cast_like,
    scalar_like,
    zero_count,
)
from sbfunc.optim._moments import Lists
from sbfunc.types import Params
from sbfunc.validation import check_bool, check_real

__all__ = ["ScaleByRmsState", "scale_by_rms"]


class ScaleByRmsState(NamedTuple):
    """The state of :func:`scale_by_rms`.

    Attributes:
        count: 0-d int64 tensor, the updates made (optax keeps it only with
            ``bias_correction``; here it is always there, so the structure does not depend on a
            flag).
        nu: the moving averages of the squared updates, keyed like the parameters
            (``initial_scale`` at ``init``).

    Example:
        >>> from sbfunc import optim
        >>> optim.scale_by_rms(initial_scale=1.0).init({"w": torch.zeros(2)})
        ScaleByRmsState(count=tensor(0), nu={'w': tensor([1., 1.])})

    References:
        DeepMind optax ``ScaleByRmsState`` and ``ScaleByRmsWithCountState``.
    """

    count: torch.Tensor  # type: ignore[assignment]  # (shadows tuple.count, as in optax)
    nu: dict[str, torch.Tensor]


@dataclasses.dataclass(frozen=True, repr=False)
class _ScaleByRms(TransformRecord):
    decay: float = 0.9
    eps: float = 1e-8
    initial_scale: float = 0.0
    eps_in_sqrt: bool = True
    bias_correction: bool = False

    def init(self, params: Params) -> ScaleByRmsState:
        for k, p in params.items():
            if p.is_complex():
                raise TypeError(
                    f"scale_by_rms takes real parameters, got the {p.dtype} parameter {k!r}"
                )
        nu = {k: torch.full_like(p, self.initial_scale) for k, p in params.items()}
        return ScaleByRmsState(zero_count(params), nu)

    def correction(self, count: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """``1 - decay ** (count + 1)`` in float64, as :func:`scale_by_adam` computes its bias
        corrections (torch's), then in the moments' dtype: in float32, ``0.999`` is
        ``0.99900001`` and ``1 - 0.999`` 1.3e-5 off (optax's, under JAX's default)."""
        t = (count + 1).to(torch.float64)
        return scalar_like(1 - torch.pow(self.decay, t), like)  # type: ignore[return-value]

    def update(
        self, updates: Params, state: ScaleByRmsState, params: Params | None = None
    ) -> tuple[Params, ScaleByRmsState]:
        updates = cast_like(updates, state.nu)  # computed in the moments' dtype

        def step(g: Lists, nu: Lists) -> tuple[Lists, Lists]:
            # (1 - decay) * g**2 + decay * nu, optax's order
            new_nu = list(torch._foreach_mul(g, g))
            torch._foreach_mul_(new_nu, 1 - self.decay)
            torch._foreach_add_(new_nu, torch._foreach_mul(nu, self.decay))
            nu_hat = new_nu
            if self.bias_correction:
                nu_hat = list(torch._foreach_div(new_nu, self.correction(state.count, g[0])))
            if self.eps_in_sqrt:  # rsqrt(nu + eps)
                scaling = list(torch._foreach_rsqrt(torch._foreach_add(nu_hat, self.eps)))
            else:  # 1 / (sqrt(nu) + eps)
                scaling = list(torch._foreach_sqrt(nu_hat))
                torch._foreach_add_(scaling, self.eps)
                torch._foreach_reciprocal_(scaling)
            torch._foreach_mul_(scaling, g)
            return scaling, new_nu

        out, nu = by_group(step, updates, state.nu, outputs=2)
        return out, ScaleByRmsState(state.count + 1, nu)


def scale_by_rms(
    decay: float = 0.9,
    eps: float = 1e-8,
    *,
    initial_scale: float = 0.0,
    eps_in_sqrt: bool = True,
    bias_correction: bool = False,
) -> GradientTransformation:
    """Divide the updates by the root of the moving average of their squares (RMSprop).

    Per update ``t`` (from 1): ``nu = (1 - decay) * g**2 + decay * nu`` (``nu`` starts at
    ``initial_scale``); with ``bias_correction``, ``nu_hat = nu / (1 - decay**t)``, else
    ``nu_hat = nu``; the update is ``g * rsqrt(nu_hat + eps)`` (``eps_in_sqrt``) or
    ``g / (sqrt(nu_hat) + eps)``. optax's definition, term by term in its order. Values agree
    with optax's to a few ulps, not bit for bit (XLA's ``rsqrt`` and ``pow`` round differently
    from torch's), except that the bias correction is computed in float64, as
    :func:`scale_by_adam`'s (torch's), where JAX computes it in float32: there ``1 - 0.999`` is
    1.3e-5 off, so with ``decay=0.999`` optax's updates are up to 7e-6 from these. So
    ``scale_by_rms(b2, eps, eps_in_sqrt=False, bias_correction=True)`` is
    :func:`scale_by_adam` with ``b1=0`` (within a few float32 ulps) without storing a first
    moment, as in optax. Gradients of another dtype are cast to the moments' (the parameters')
    dtype.

    Args:
        decay: the decay of the average, in ``[0, 1)``.
        eps: added to ``nu_hat`` (inside the root with ``eps_in_sqrt``), ``>= 0``.
        initial_scale: the average before the first update, ``>= 0``.
        eps_in_sqrt: add ``eps`` inside the square root (optax's default) or after it.
        bias_correction: divide the average by ``1 - decay**t``.

    Returns:
        A :class:`GradientTransformation` with state :class:`ScaleByRmsState`.

    Raises:
        TypeError: for arguments of the wrong type; at ``init``, complex parameters.
        ValueError: for out-of-range values.

    Example:
        >>> from sbfunc import optim
        >>> opt = optim.scale_by_rms(0.75, eps=0.0)
        >>> opt.update({"w": torch.tensor([2.0, -4.0])}, opt.init({"w": torch.zeros(2)}))[0]
        {'w': tensor([ 2., -2.])}

    References:
        Tieleman and Hinton 2012, "Lecture 6.5 - RMSProp" (COURSERA: Neural Networks for
        Machine Learning); DeepMind optax ``scale_by_rms``.
    """
    return _ScaleByRms(
        name="scale_by_rms",
        decay=check_real(decay, "decay", low=0.0, high=1.0, open_high=True),
        eps=check_real(eps, "eps", low=0.0),
        initial_scale=check_real(initial_scale, "initial_scale", low=0.0),
        eps_in_sqrt=check_bool(eps_in_sqrt, "eps_in_sqrt"),
        bias_correction=check_bool(bias_correction, "bias_correction"),
    ).transformation()
