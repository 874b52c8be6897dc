"""The gradient-transformation type, ``chain`` and ``apply_updates``, and the foreach helpers
the transforms share."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from sbfunc.optim._checks import call_repr
from sbfunc.optim._schedules import value_at
from sbfunc.types import EmptyState, Params

__all__ = [
    "HIDDEN_UNSET",
    "EmptyState",
    "GradientTransformation",
    "Held",
    "Scalar",
    "TransformRecord",
    "apply_updates",
    "by_group",
    "cast_like",
    "chain",
    "check_grads",
    "counted",
    "hyperparam_at",
    "is_zero",
    "kept_in",
    "narrowed",
    "optimizer_of",
    "scalar_like",
    "widened",
    "zero_count",
]

Scalar = float | torch.Tensor
"""A hyperparameter's value in one step: a Python float, or a 0-d float64 tensor."""


class GradientTransformation(NamedTuple):
    """A gradient transformation as two pure functions, optax's ``GradientTransformation``.

    ``state = init(params)``; ``updates, state = update(updates, state, params=None)`` maps
    gradients (or the updates of an earlier transformation) to updates, which
    :func:`apply_updates` adds to the parameters. ``update`` never modifies its inputs. States
    are NamedTuples of tensors and of dicts of tensors keyed like ``params`` (a :func:`chain`'s
    is the tuple of its parts' states), with a fixed structure from ``init`` on: they
    checkpoint against a fresh ``init(params)``, and step counts are 0-d int64 tensors, so a
    compiled update compiles once.

    Attributes:
        init: ``params -> state``.
        update: ``(updates, state, params=None) -> (updates, state)``; ``updates`` has the
            keys of ``params``; ``params`` is needed by the transformations that read the
            parameters (weight decay).

    Example:
        >>> from sbfunc import optim
        >>> opt = optim.sgd(0.1)
        >>> params = {"w": torch.ones(2)}
        >>> updates, state = opt.update({"w": torch.ones(2)}, opt.init(params), params)
        >>> updates["w"], optim.apply_updates(params, updates)["w"]
        (tensor([-0.1000, -0.1000]), tensor([0.9000, 0.9000]))
        >>> opt
        sgd(lr=0.1, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0, maximize=False)

    References:
        DeepMind optax ``GradientTransformation``; PyTorch ``torch.optim`` (whose foreach
        kernels the transformations run).
    """

    init: Callable[[Params], Any]
    update: Callable[..., tuple[Params, Any]]

    def __repr__(self) -> str:
        owner = getattr(self.update, "__self__", None)
        if isinstance(owner, TransformRecord) and getattr(self.init, "__self__", None) is owner:
            return repr(owner)
        return f"GradientTransformation(init={self.init!r}, update={self.update!r})"


@dataclasses.dataclass(frozen=True, repr=False)
class TransformRecord:
    """Base of the transformations' records: ``init`` and ``update`` are its methods,
    :meth:`transformation` pairs them, and the repr reads as the building call (``name`` and
    the fields declared with ``repr=False`` are left out)."""

    name: str = dataclasses.field(repr=False)

    def init(self, params: Params) -> Any:
        raise NotImplementedError

    def update(
        self, updates: Params, state: Any, params: Params | None = None
    ) -> tuple[Params, Any]:
        raise NotImplementedError

    def transformation(self) -> GradientTransformation:
        """This record's ``init`` and ``update`` as a :class:`GradientTransformation`."""
        return GradientTransformation(self.init, self.update)

    def __repr__(self) -> str:
        shown = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.repr and not (f.metadata.get("unset_hidden") and getattr(self, f.name) is None)
        }
        return call_repr(self.name, shown)


HIDDEN_UNSET = {"unset_hidden": True}
"""The metadata of a record field defaulting to ``None`` that the repr shows only when set (the
options added after the reprs were fixed, such as ``mu_dtype``):
``dataclasses.field(default=None, metadata=HIDDEN_UNSET)``."""


@dataclasses.dataclass(frozen=True, repr=False)
class _Chain(TransformRecord):
    parts: tuple[GradientTransformation, ...] = dataclasses.field(repr=False)
    call: str = dataclasses.field(repr=False, default="")

    def init(self, params: Params) -> tuple[Any, ...]:
        return tuple(t.init(params) for t in self.parts)

    def update(
        self, updates: Params, state: tuple[Any, ...], params: Params | None = None
    ) -> tuple[Params, tuple[Any, ...]]:
        if not isinstance(state, tuple) or len(state) != len(self.parts):
            got = f"{len(state)} states" if isinstance(state, tuple) else type(state).__name__
            raise ValueError(
                f"the state of a chain of {len(self.parts)} transformations must be a tuple of "
                f"{len(self.parts)} states (from its init), got {got}"
            )
        new = []
        for t, s in zip(self.parts, state, strict=True):
            updates, s = t.update(updates, s, params)
            new.append(s)
        return updates, tuple(new)

    def __repr__(self) -> str:
        return self.call or f"chain({', '.join(repr(t) for t in self.parts)})"


def chain(*transforms: GradientTransformation) -> GradientTransformation:
    """The transformations applied one after the other, optax's ``chain``.

    The state is the tuple of the parts' states, in order; ``update`` raises ``ValueError`` on
    a state of another length.

    Args:
        *transforms: the transformations, first applied first.

    Returns:
        A :class:`GradientTransformation` whose state is a tuple of one state per part.

    Raises:
        TypeError: if a part is not an ``(init, update)`` pair of callables.

    Example:
        >>> from sbfunc import optim
        >>> opt = optim.chain(optim.clip_by_global_norm(1.0), optim.scale_by_learning_rate(0.1))
        >>> params = {"w": torch.zeros(2)}
        >>> updates, state = opt.update({"w": torch.tensor([3.0, 4.0])}, opt.init(params))
        >>> updates["w"], len(state)
        (tensor([-0.0600, -0.0800]), 2)

    References:
        DeepMind optax ``chain``.
    """
    for i, t in enumerate(transforms):
        if not (callable(getattr(t, "init", None)) and callable(getattr(t, "update", None))):
            raise TypeError(
                f"transforms[{i}] must be a GradientTransformation (init, update), got "
                f"{type(t).__name__}"
            )
    return _Chain(name="chain", parts=tuple(transforms)).transformation()


def optimizer_of(call: str, parts: list[GradientTransformation]) -> GradientTransformation:
    """The public optimizers: their parts chained (a single part is itself, so its state is
    not wrapped in a tuple), with ``call`` as the repr and the gradient keys checked."""
    return _Named(name="named", parts=tuple(parts), call=call).transformation()


@dataclasses.dataclass(frozen=True, repr=False)
class _Named(_Chain):
    def init(self, params: Params) -> Any:
        if len(self.parts) == 1:
            return self.parts[0].init(params)
        return super().init(params)

    def update(
        self, updates: Params, state: Any, params: Params | None = None
    ) -> tuple[Params, Any]:
        check_grads(updates, params)
        if params is not None:  # gradients of another dtype: computed in the parameters'
            updates = cast_like(updates, params)
        if len(self.parts) == 1:
            return self.parts[0].update(updates, state, params)
        return super().update(updates, state, params)


def apply_updates(params: Params, updates: Params) -> Params:
    """``params + updates``, key by key, with one foreach add per (device, dtype) group.

    New tensors; neither input is modified. Updates are cast to each parameter's dtype first
    (optax's rule), and a ``-0.0`` update leaves every parameter bit for bit (``0.0`` would turn
    a ``-0.0`` parameter into ``0.0``), which is what the skipping transformations return.

    Args:
        params: the parameters, a dict of tensors.
        updates: the updates, with the keys of ``params``.

    Returns:
        The new parameters, keyed like ``params``.

    Raises:
        TypeError: if either is not a dict.
        ValueError: if their keys differ.

    Example:
        >>> from sbfunc import optim
        >>> optim.apply_updates({"w": torch.ones(2)}, {"w": torch.tensor([0.5, -1.0])})
        {'w': tensor([1.5000, 0.0000])}

    References:
        DeepMind optax ``apply_updates``.
    """
    check_grads(updates, params)

    def add(p: list[torch.Tensor], u: list[torch.Tensor]) -> tuple[list[torch.Tensor]]:
        u = [x if x.dtype == y.dtype else x.to(y.dtype) for x, y in zip(u, p, strict=True)]
        return (list(torch._foreach_add(p, u)),)

    return by_group(add, params, updates)[0]


def cast_like(updates: Params, like: Params) -> Params:
    """``updates`` with each tensor cast to the dtype of ``like``'s tensor under its key (the
    same tensor where the dtypes already agree): gradients of another dtype than the
    parameters (bfloat16 gradients of float32 parameters, or the reverse) are computed in the
    dtype of the state and the parameters. A cast, never a host sync."""
    return {k: u if u.dtype == like[k].dtype else u.to(like[k].dtype) for k, u in updates.items()}


def zero_count(params: Params) -> torch.Tensor:
    """A 0-d int64 zero on the device of the first parameter (CPU for no parameters)."""
    device = next(iter(params.values())).device if params else torch.device("cpu")
    return torch.zeros((), dtype=torch.int64, device=device)


def kept_in(dtype: torch.dtype | None, params: Params) -> Params:
    """Zeros like ``params``, in ``dtype`` (``None``: each parameter's)."""
    return {k: torch.zeros_like(p, dtype=dtype) for k, p in params.items()}


def widened(dtype: torch.dtype | None, updates: Params, *trees: Params) -> tuple[Params, ...]:
    """``updates`` and ``trees`` in the dtype they are computed in when a state is kept in
    ``dtype``: the promotion of each update's dtype and ``dtype`` (optax's ``mu_dtype`` and
    ``accumulator_dtype``: the computation is not narrowed, only what is stored); ``None``:
    unchanged. ``.to`` of a tensor already in that dtype is the tensor itself."""
    if dtype is None:
        return (updates, *trees)
    wide = {k: torch.promote_types(u.dtype, dtype) for k, u in updates.items()}
    return tuple({k: t.to(wide[k]) for k, t in tree.items()} for tree in (updates, *trees))


def narrowed(dtype: torch.dtype | None, tree: Params) -> Params:
    """``tree`` stored in ``dtype`` (``None``: as it is)."""
    return tree if dtype is None else {k: t.to(dtype) for k, t in tree.items()}


class Held:
    """A hyperparameter read from a state (:func:`~sbfunc.optim.inject_hyperparams`): a number
    held in a 0-d tensor. Callable like a schedule (its value at any count), so it passes where
    schedules do, but it adds no step count to a state: a transformation built with it has the
    state of the one built with the number, as optax's ``inject_hyperparams`` builds its inner
    optimizer with plain values."""

    __slots__ = ("value",)

    def __init__(self, value: torch.Tensor) -> None:
        self.value = value

    def __call__(self, count: Any = None) -> torch.Tensor:
        return self.value

    def leaves_out(self) -> bool:
        """Whether the transformation leaves out the part that would read this value (what
        :func:`is_zero` answers): never for a held value."""
        return False

    def __repr__(self) -> str:
        return "<injected>"


def counted(*values: Any) -> bool:
    """Whether a transformation with these hyperparameters keeps a step count: one of them is
    a schedule (a :class:`Held` value is a number)."""
    return any(callable(v) and not isinstance(v, Held) for v in values)


def hyperparam_at(value: float | Callable[..., Any], count: torch.Tensor | None) -> Scalar:
    """A hyperparameter's value at ``count``: a float stays, a schedule is evaluated to a 0-d
    float64 tensor on the count's device (tensor ops only, no host sync), a :class:`Held`
    value is its tensor in float64 (``count`` may then be ``None``)."""
    if isinstance(value, Held):
        return value.value.to(torch.float64)
    if not callable(value):
        return value
    if count is None:  # (a transformation whose state has no count: a bug of its own)
        raise RuntimeError("a scheduled hyperparameter needs the state's step count")
    return value_at(value, count)


def check_grads(grads: Any, params: Any) -> None:
    """Raise unless ``grads`` is a dict with the keys of ``params`` (a dict, or ``None``)."""
    if not isinstance(grads, dict) or (params is not None and not isinstance(params, dict)):
        raise TypeError(
            f"grads and params must be dicts of tensors, got {type(grads).__name__} and "
            f"{type(params).__name__}"
        )
    if params is not None and grads.keys() != params.keys():
        missing = sorted(params.keys() - grads.keys())
        extra = sorted(grads.keys() - params.keys())
        raise ValueError(
            f"grads must have the keys of params; missing {missing}, unexpected {extra}"
        )


def need_params(params: Params | None, what: str) -> Params:
    """``params``, or a ``ValueError`` saying that ``what`` reads them."""
    if params is None:
        raise ValueError(f"{what} reads the parameters: call update(updates, state, params)")
    return params


def by_group(
    fn: Callable[..., tuple[list[torch.Tensor], ...]], *trees: Params, outputs: int = 1
) -> tuple[Params, ...]:
    """``fn`` on the values of ``trees`` as lists, once per (device, dtype) group of the first
    tree's keys (one foreach call per group keeps torch's fast multi-tensor path); each of the
    ``outputs`` lists ``fn`` returns becomes a dict keyed like the first tree (an empty list:
    an empty dict)."""
    layout = tuple([(k, t.device, t.dtype) for k, t in trees[0].items()])
    groups = _grouped(layout) if torch.compiler.is_compiling() else _memo_grouped(layout)
    if len(groups) == 1:  # one device and dtype (the common case): the dicts in one go
        keys = groups[0]
        results = fn(*([tree[k] for k in keys] for tree in trees))
        return tuple(
            dict(zip(keys, r, strict=False)) for _, r in zip(range(outputs), results, strict=True)
        )
    outs: tuple[dict[str, torch.Tensor], ...] = tuple({} for _ in range(outputs))
    for keys in groups:
        results = fn(*([tree[k] for k in keys] for tree in trees))
        for d, r in zip(outs, results, strict=True):
            d.update(zip(keys, r, strict=False))
    if len(groups) < 2:
        return outs
    return tuple({k: d[k] for k in trees[0] if k in d} for d in outs)


_Layout = tuple[tuple[str, torch.device, torch.dtype], ...]


def _grouped(layout: _Layout) -> tuple[tuple[str, ...], ...]:
    """The keys of a tree's ``layout`` (key, device, dtype per entry) by (device, dtype)."""
    by: dict[tuple[torch.device, torch.dtype], list[str]] = {}
    for k, device, dtype in layout:
        by.setdefault((device, dtype), []).append(k)
    return tuple(tuple(keys) for keys in by.values())


# Eagerly, :func:`by_group` runs twice a step on the same few layouts: remember the last ones
# (names, devices and dtypes only, never a tensor; a bounded cache).
_memo_grouped = functools.lru_cache(maxsize=32)(_grouped)


def scalar_like(value: Scalar | None, like: torch.Tensor) -> Scalar | None:
    """``value`` with the device and dtype of ``like`` (floats and ``None`` unchanged).

    A 0-d float64 scalar would otherwise promote 0-d parameters to float64; for float32
    parameters the cast is the one torch applies to a Python-float scalar, so results stay
    bitwise equal. (For float16/bfloat16 parameters, scheduled values and Adam's bias
    corrections are thereby rounded to that dtype.)
    """
    if isinstance(value, torch.Tensor):
        return value.to(device=like.device, dtype=like.dtype)
    return value


def is_zero(value: Any) -> bool:
    """Whether a hyperparameter is the float 0, so that the part that reads it is left out (a
    scheduled one never is, statically; a :class:`Held` one answers itself)."""
    if isinstance(value, Held):
        return value.leaves_out()
    return not isinstance(value, torch.Tensor) and not callable(value) and value == 0
