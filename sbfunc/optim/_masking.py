"""Transforming part of the parameters: :func:`masked` runs a transformation on the keys a
mask selects and passes the others through; :func:`set_to_zero` freezes what it is given."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from sbfunc.optim._apply_if_finite import negative_zeros
from sbfunc.optim._base import EmptyState, GradientTransformation, TransformRecord
from sbfunc.types import Params
from sbfunc.validation import check_bool
from sbfunc.validation import describe as describe_value

__all__ = ["Mask", "MaskedState", "check_transformation", "masked", "set_to_zero"]

Mask = Mapping[str, bool] | Callable[[Params], Mapping[str, bool]]
"""Which parameters a transformation applies to: ``{name: bool}`` with the parameters' keys,
or a function of the parameters (or updates) returning one."""


class MaskedState(NamedTuple):
    """The state of :func:`masked`.

    Attributes:
        inner_state: the inner transformation's state, made by ``init`` on the selected
            parameters only (so a masked-out parameter costs no moment buffers).

    Example:
        >>> from sbfunc import optim
        >>> opt = optim.masked(optim.trace(0.9), {"w": True, "b": False})
        >>> opt.init({"w": torch.ones(2), "b": torch.ones(1)}).inner_state.momentum_buffer
        {'w': tensor([0., 0.])}

    References:
        DeepMind optax ``MaskedState``.
    """

    inner_state: Any


def check_transformation(value: Any, name: str) -> GradientTransformation:
    """``value`` when it is an ``(init, update)`` pair of callables, else a ``TypeError``."""
    if not (callable(getattr(value, "init", None)) and callable(getattr(value, "update", None))):
        raise TypeError(
            f"{name} must be a GradientTransformation (init, update), got {describe_value(value)}"
        )
    return value


@dataclasses.dataclass(frozen=True, repr=False)
class _Masked(TransformRecord):
    inner: GradientTransformation
    mask: Any

    def selected(self, tree: Params) -> list[str]:
        """The keys of ``tree`` the mask selects (a callable mask is called on ``tree``)."""
        mask = self.mask(tree) if callable(self.mask) else self.mask
        if not isinstance(mask, Mapping):
            raise TypeError(
                f"mask must be a dict {{name: bool}} (or return one), got {describe_value(mask)}"
            )
        if mask.keys() != tree.keys():
            missing, extra = sorted(tree.keys() - mask.keys()), sorted(mask.keys() - tree.keys())
            raise ValueError(
                f"mask must have the keys of the parameters; missing {missing}, unexpected {extra}"
            )
        return [k for k in tree if check_bool(mask[k], f"mask[{k!r}]")]

    def init(self, params: Params) -> MaskedState:
        return MaskedState(self.inner.init({k: params[k] for k in self.selected(params)}))

    def update(
        self, updates: Params, state: MaskedState, params: Params | None = None
    ) -> tuple[Params, MaskedState]:
        keys = self.selected(updates)
        some = None if params is None else {k: params[k] for k in keys}
        new, inner = self.inner.update({k: updates[k] for k in keys}, state.inner_state, some)
        return {k: new.get(k, u) for k, u in updates.items()}, MaskedState(inner)


def masked(inner: GradientTransformation, mask: Mask) -> GradientTransformation:
    """Apply ``inner`` to the parameters ``mask`` selects; pass the other updates through.

    ``inner`` sees only the selected keys (its state holds only theirs); the updates of the
    others come out as they came in, the same tensors (optax's rule: they are not zeroed; chain
    :func:`set_to_zero` under the opposite mask to freeze them). A dict mask has the keys of
    the updates it is given (in :func:`masked` inside :func:`masked`, the keys the outer one
    selected); a callable mask is called on the parameters at ``init`` and on the updates at
    ``update``, so it should read only names, shapes and dtypes. The mask is read on the host
    (Python bools), which fixes the structure a compiled step traces.

    Args:
        inner: the transformation to apply to the selected parameters.
        mask: ``{name: bool}`` with the parameters' keys (``True``: transformed), or a function
            of the parameters returning one.

    Returns:
        A :class:`GradientTransformation` with state :class:`MaskedState`.

    Raises:
        TypeError: if ``inner`` is not a transformation or ``mask`` is neither a mapping nor a
            callable; at ``init``/``update``, a mask value that is not a bool.
        ValueError: at ``init``/``update``, a mask whose keys differ from the parameters'.

    Example:
        >>> from sbfunc import optim
        >>> no_decay_on_bias = optim.masked(
        ...     optim.add_decayed_weights(0.1), lambda p: {k: v.dim() > 1 for k, v in p.items()})
        >>> params = {"w": torch.ones(1, 2), "b": torch.ones(2)}
        >>> grads = {"w": torch.zeros(1, 2), "b": torch.zeros(2)}
        >>> no_decay_on_bias.update(grads, no_decay_on_bias.init(params), params)[0]
        {'w': tensor([[0.1000, 0.1000]]), 'b': tensor([0., 0.])}

    References:
        DeepMind optax ``masked``; Loshchilov and Hutter 2019, "Decoupled Weight Decay
        Regularization" (no decay on biases and normalization weights).
    """
    inner = check_transformation(inner, "inner")
    if not (callable(mask) or isinstance(mask, Mapping)):
        raise TypeError(
            f"mask must be a dict {{name: bool}} or a function of the parameters returning "
            f"one, got {describe_value(mask)}"
        )
    return _Masked(name="masked", inner=inner, mask=mask).transformation()


@dataclasses.dataclass(frozen=True, repr=False)
class _SetToZero(TransformRecord):
    def init(self, params: Params) -> EmptyState:
        return EmptyState()

    def update(
        self, updates: Params, state: EmptyState, params: Params | None = None
    ) -> tuple[Params, EmptyState]:
        return negative_zeros(updates), state


def set_to_zero() -> GradientTransformation:
    """Replace every update by zero: the parameters it sees stay where they are.

    Under :func:`masked` it freezes part of a model:
    ``chain(masked(opt, trainable), masked(set_to_zero(), frozen))``. The zeros are ``-0.0``,
    sbfunc's no-op update, which :func:`apply_updates` adds without changing any parameter
    bit (optax's ``+0.0`` turns a ``-0.0`` parameter into ``+0.0``; the two are equal numbers).

    Returns:
        A :class:`GradientTransformation` with state :class:`EmptyState`.

    Example:
        >>> from sbfunc import optim
        >>> frozen = {"w": False, "b": True}
        >>> opt = optim.chain(
        ...     optim.masked(optim.sgd(0.1), {k: not f for k, f in frozen.items()}),
        ...     optim.masked(optim.set_to_zero(), frozen))
        >>> params = {"w": torch.ones(2), "b": torch.ones(1)}
        >>> grads = {"w": torch.ones(2), "b": torch.ones(1)}
        >>> optim.apply_updates(params, opt.update(grads, opt.init(params), params)[0])
        {'w': tensor([0.9000, 0.9000]), 'b': tensor([1.])}

    References:
        DeepMind optax ``set_to_zero`` (and its freezing recipe with ``masked``).
    """
    return _SetToZero(name="set_to_zero").transformation()
