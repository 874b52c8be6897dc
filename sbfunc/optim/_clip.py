"""Clipping by the global norm, with torch's or optax's formula for the scale."""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch

from sbfunc.optim._base import GradientTransformation, by_group
from sbfunc.optim._transforms import Stateless, times
from sbfunc.types import Params
from sbfunc.validation import check_choice, check_real

__all__ = ["ClipFormula", "clip_by_global_norm"]

ClipFormula = Literal["torch", "optax"]
"""The scale of :func:`clip_by_global_norm`: ``"torch"`` (``clip_grad_norm_``'s) or
``"optax"`` (the exact one)."""

_FORMULAS: tuple[ClipFormula, ...] = ("torch", "optax")
_F64 = torch.float64


@dataclasses.dataclass(frozen=True, repr=False)
class _ClipByGlobalNorm(Stateless):
    max_norm: float
    formula: ClipFormula = "torch"

    def apply(self, updates: Params) -> Params:
        if not updates:
            return {}
        norms = by_group(lambda u: (list(torch._foreach_norm(u)),), updates)[0]
        first = next(iter(norms.values())).device
        if self.formula == "torch":  # torch.nn.utils.clip_grad_norm_, rounding included
            total = torch.linalg.vector_norm(torch.stack([n.to(first) for n in norms.values()]))
            coef = (self.max_norm / (total + 1e-6)).clamp(max=1.0)
        else:  # optax: exactly 1 at or under max_norm, max_norm / norm over it (in float64)
            total = torch.linalg.vector_norm(
                torch.stack([n.to(device=first, dtype=_F64) for n in norms.values()])
            )
            coef = self.max_norm / total.clamp(min=self.max_norm)
        return by_group(lambda u: (times(u, coef),), updates)[0]


def clip_by_global_norm(
    max_norm: float, *, formula: ClipFormula = "torch"
) -> GradientTransformation:
    """Scale the updates down so that their global norm is at most ``max_norm``.

    ``||u||`` is the 2-norm of all the updates together (foreach norms, no host sync), and
    ``formula`` chooses the scale:

    - ``"torch"`` (the default), ``torch.nn.utils.clip_grad_norm_``'s:
      ``u -> u * min(1, max_norm / (||u|| + 1e-6))``. The ``1e-6`` guards a zero norm, so a
      clipped update lands short of ``max_norm`` (by ``1e-6 * max_norm / ||u||``, relative),
      and updates with ``||u|| > max_norm - 1e-6`` shrink slightly although they are within
      the bound.
    - ``"optax"``, optax's exact scale: ``u -> u * max_norm / max(||u||, max_norm)``, computed
      in float64: a clipped update has norm ``max_norm`` up to the rounding of its dtype, and
      updates with ``||u|| <= max_norm`` are multiplied by exactly 1 (left bit for bit).

    A non-finite norm makes the updates non-finite (wrap the chain in :func:`apply_if_finite`).

    Args:
        max_norm: the largest global norm, ``> 0``.
        formula: ``"torch"`` or ``"optax"`` (see above).

    Returns:
        A :class:`GradientTransformation` with state :class:`EmptyState`.

    Raises:
        TypeError: if ``max_norm`` is not a float.
        ValueError: if ``max_norm`` is not ``> 0``, or ``formula`` is neither ``"torch"`` nor
            ``"optax"``.

    Example:
        >>> from sbfunc import optim
        >>> grads = {"a": torch.tensor([3.0]), "b": torch.tensor([4.0])}
        >>> opt = optim.clip_by_global_norm(1.0)
        >>> opt.update(grads, opt.init({}))[0]
        {'a': tensor([0.6000]), 'b': tensor([0.8000])}
        >>> exact = optim.clip_by_global_norm(5.0, formula="optax")
        >>> torch.equal(exact.update(grads, exact.init({}))[0]["a"], grads["a"])
        True

    References:
        Pascanu et al. 2013, "On the difficulty of training recurrent neural networks";
        PyTorch ``torch.nn.utils.clip_grad_norm_``; DeepMind optax ``clip_by_global_norm``.
    """
    bound = check_real(max_norm, "max_norm", low=0.0, open_low=True)
    choice = check_choice(formula, "formula", _FORMULAS)
    return _ClipByGlobalNorm(
        name="clip_by_global_norm", max_norm=bound, formula=choice
    ).transformation()
