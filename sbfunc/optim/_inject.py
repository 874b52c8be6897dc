"""``inject_hyperparams``: an optimizer's numeric hyperparameters kept in its state, where they
can be read and replaced, and schedules evaluated from the state's step count."""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import torch

from sbfunc.optim._base import GradientTransformation, Held, TransformRecord, zero_count
from sbfunc.optim._checks import call_repr, check_dtype
from sbfunc.optim._schedules import value_at
from sbfunc.types import Params
from sbfunc.validation import check_callable

__all__ = ["InjectHyperparamsState", "inject_hyperparams"]


class InjectHyperparamsState(NamedTuple):
    """The state of an optimizer made by :func:`inject_hyperparams`.

    Attributes:
        count: 0-d int64 tensor, the updates made (the schedules' step count).
        hyperparams: ``{name: 0-d tensor}``, the injected hyperparameters: a number's current
            value (replace it to change the next updates) and a schedule's value at the last
            update (at ``init``: at step 0; replacing it has no effect). A number 0 whose part
            the optimizer leaves out (``weight_decay=0``) is not among them.
        inner_state: the state of the optimizer the factory builds: the structure of the
            plain optimizer built with the same numbers (optax's).

    Example:
        >>> from sbfunc import optim
        >>> opt = optim.inject_hyperparams(optim.sgd)(learning_rate=0.1, momentum=0.9)
        >>> state = opt.init({"w": torch.ones(1)})
        >>> state.hyperparams
        {'learning_rate': tensor(0.1000, dtype=torch.float64)}
        >>> state.inner_state  # sgd(0.1, momentum=0.9)'s: trace, then the learning rate
        (TraceState(count=tensor(0), momentum_buffer={'w': tensor([0.])}), EmptyState())

    References:
        DeepMind optax ``InjectHyperparamsState``.
    """

    count: torch.Tensor  # type: ignore[assignment]  # (shadows tuple.count, as in optax)
    hyperparams: dict[str, torch.Tensor]
    inner_state: Any


class _ZeroProbe(Held):
    """A number 0 at construction: answers :func:`~sbfunc.optim._base.is_zero` as the number
    would and records that the factory asked (the factory then leaves that part out, as the
    plain optimizer does: the argument stays fixed)."""

    __slots__ = ("asked",)

    def __init__(self) -> None:
        super().__init__(torch.zeros((), dtype=torch.float64))
        self.asked = False

    def leaves_out(self) -> bool:
        self.asked = True
        return True


def _left_out(factory: Callable[..., Any], parts: Mapping[str, Mapping[str, Any]]) -> set[str]:
    """The numbers given as 0 whose part the factory leaves out (sbfunc's ``weight_decay=0``),
    found by building it once as :meth:`_Inject.build` does, with each such 0 a probe."""
    numbers = parts["numbers"]
    probes = {
        k: _ZeroProbe() for k, v in numbers.items() if not isinstance(v, torch.Tensor) and v == 0
    }
    if not probes:
        return set()
    zero = torch.zeros((), dtype=torch.int64)
    held = {k: Held(torch.as_tensor(v, dtype=torch.float64)) for k, v in numbers.items()}
    held.update({k: Held(value_at(s, zero)) for k, s in parts["schedules"].items()})
    factory(**parts["fixed"], **{**held, **probes})
    return {k for k, probe in probes.items() if probe.asked}


def _mentions_callable(hint: Any) -> bool:
    if hint is collections.abc.Callable or typing.get_origin(hint) is collections.abc.Callable:
        return True
    return any(_mentions_callable(a) for a in typing.get_args(hint) if not isinstance(a, list))


def _schedulable(factory: Callable[..., Any]) -> Callable[[str], bool]:
    """Whether the factory's argument ``name`` takes a schedule: its annotation names a
    callable (sbfunc's ``HParam``), or it has none."""
    try:
        hints = typing.get_type_hints(factory)
    except (NameError, TypeError, AttributeError):  # unresolvable: every argument may be
        hints = {}
    return lambda name: name not in hints or _mentions_callable(hints[name])


def _is_number(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.dim() == 0 and value.is_floating_point()
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True, repr=False)
class _Inject(TransformRecord):
    factory: Callable[..., GradientTransformation]
    fixed: Mapping[str, Any]
    numbers: Mapping[str, Any]
    schedules: Mapping[str, Callable[..., Any]]
    dtype: torch.dtype | None = None
    call: str = ""

    def tensor(self, value: Any, count: torch.Tensor) -> torch.Tensor:
        """A number as a 0-d tensor on the count's device (a tensor keeps its dtype)."""
        if isinstance(value, torch.Tensor):
            return value.to(count.device)
        return torch.tensor(value, dtype=self.dtype or torch.float64, device=count.device)

    def values(self, numbers: Mapping[str, Any], count: torch.Tensor) -> dict[str, torch.Tensor]:
        """The hyperparameters of the update at ``count``: ``numbers`` and the schedules."""
        out = {k: self.tensor(v, count) for k, v in numbers.items()}
        for k, schedule in self.schedules.items():
            value = value_at(schedule, count)
            out[k] = value if self.dtype is None else value.to(self.dtype)
        return out

    def build(self, values: Mapping[str, torch.Tensor]) -> GradientTransformation:
        return self.factory(**self.fixed, **{k: Held(v) for k, v in values.items()})

    def init(self, params: Params) -> InjectHyperparamsState:
        count = zero_count(params)
        values = self.values(self.numbers, count)
        return InjectHyperparamsState(count, values, self.build(values).init(params))

    def update(
        self, updates: Params, state: InjectHyperparamsState, params: Params | None = None
    ) -> tuple[Params, InjectHyperparamsState]:
        self.check_names(state.hyperparams)
        numbers = {k: state.hyperparams[k] for k in self.numbers}
        values = self.values(numbers, state.count)
        out, inner = self.build(values).update(updates, state.inner_state, params)
        return out, InjectHyperparamsState(state.count + 1, values, inner)

    def check_names(self, hyperparams: Mapping[str, Any]) -> None:
        """Raise unless ``hyperparams`` has the injected names (a name added to the state
        would be read by nothing)."""
        names = {*self.numbers, *self.schedules}
        if set(hyperparams) != names:
            raise ValueError(
                f"state.hyperparams of {self.call} must have the names {sorted(names)}, got "
                f"{sorted(hyperparams)}: an argument given as 0 where the factory leaves its "
                "part out (weight_decay=0) stays fixed; build with a nonzero value, a 0-d tensor "
                "or a schedule to change it in the state"
            )

    def __repr__(self) -> str:
        return self.call


def _keywords(signature: inspect.Signature, bound: inspect.BoundArguments) -> dict[str, Any]:
    """The bound arguments as the keywords the factory is called with (``**kwargs`` spread)."""
    out: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            out.update(value)
        elif kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.POSITIONAL_ONLY):
            raise TypeError(
                f"inject_hyperparams calls inner_factory with keywords: {name} cannot be given"
            )
        else:
            out[name] = value
    return out


def _static_names(static_args: str | Iterable[str], names: Iterable[str]) -> frozenset[str]:
    static = frozenset([static_args] if isinstance(static_args, str) else static_args)
    if not static <= set(names):
        raise ValueError(
            f"static_args must name arguments of inner_factory; {sorted(static - set(names))} "
            f"are not among {sorted(names)}"
        )
    return static


def inject_hyperparams(
    inner_factory: Callable[..., GradientTransformation],
    *,
    static_args: str | Iterable[str] = (),
    hyperparam_dtype: torch.dtype | None = None,
) -> Callable[..., GradientTransformation]:
    """Keep an optimizer's numeric hyperparameters in its state, optax's ``inject_hyperparams``.

    ``inject_hyperparams(factory)(**kwargs)`` is a transformation with state
    :class:`InjectHyperparamsState`: ``hyperparams`` holds every numeric argument (the
    defaults included) as a 0-d tensor, read at each update, so replacing it in the state
    (``state._replace(hyperparams={**state.hyperparams, "learning_rate": lr})``) changes the
    next updates; a callable argument is a schedule, evaluated at the state's ``count`` (from
    0) with tensor ops, and its value stored. Each update builds ``factory`` with the values
    as constant schedules, so a compiled update compiles once, whatever the values. Only
    arguments the factory takes as schedules are injected (sbfunc's ``HParam`` ones, such as
    ``lr``/``learning_rate``, ``weight_decay`` and ``scale``'s ``step_size``; an unannotated
    argument counts as one): the others (Adam's ``b1``, ``b2``, ``eps``, SGD's
    ``momentum``: Python numbers in torch's kernels), bools, ``None`` and ``static_args``
    stay fixed. Values are float64 tensors by default (a Python float's precision: constant
    values give the plain optimizer's updates bit for bit, a coupled weight decay as a
    schedule gives them, multiplied then added where a float fuses the two), where optax uses
    the parameters' dtype; a tensor argument keeps its dtype. Not to be confused with
    :func:`sbfunc.schedule_hyperparams` (sbfunc 0.3's ``inject_hyperparams``), which
    schedules an *algorithm's* hyperparameters by the fraction of training.

    As optax's, the inner state has the structure of the plain optimizer's built with the
    same numbers (``inner_state`` of ``inject_hyperparams(adam)(0.1)`` is a
    :class:`ScaleByAdamState`, as ``adam(0.1).init``'s): a value from the state adds no step
    count, and a number 0 for which the factory leaves its part out (sbfunc's
    ``weight_decay=0``, where optax's optimizers keep a stateless part) stays fixed, out of
    ``hyperparams``; give it as a 0-d tensor (``torch.tensor(0.0)``) or a schedule to change
    it in the state. A schedule's inner state is the one built with its values (no count),
    as in optax.

    Args:
        inner_factory: ``(**hyperparameters) -> GradientTransformation``, such as
            :func:`sgd`, :func:`adam` or :func:`scale`; called with keywords.
        static_args: names of arguments kept fixed although numeric or callable (a callable
            that is not a schedule, such as :func:`masked`'s mask function, must be here).
        hyperparam_dtype: ``None`` (float64) or the floating dtype of the stored values.

    Returns:
        ``(*args, **kwargs) -> GradientTransformation``, with ``inner_factory``'s signature.

    Raises:
        TypeError: if ``inner_factory`` is not callable or ``hyperparam_dtype`` is not a
            floating dtype; when called, a schedule for an argument the factory takes only as
            a number, or the factory's own errors for the initial values.
        ValueError: if ``static_args`` names an argument ``inner_factory`` does not have; at
            ``update``, a state whose ``hyperparams`` has other names than the injected ones.

    Example:
        >>> from sbfunc import optim
        >>> opt = optim.inject_hyperparams(optim.sgd)(learning_rate=0.1)
        >>> params = {"w": torch.ones(2)}
        >>> state = opt.init(params)
        >>> state = state._replace(hyperparams={**state.hyperparams, "learning_rate": 0.5})
        >>> opt.update({"w": torch.ones(2)}, state, params)[0]
        {'w': tensor([-0.5000, -0.5000])}

    References:
        DeepMind optax ``inject_hyperparams``.
    """
    check_callable(inner_factory, "inner_factory")
    signature = inspect.signature(inner_factory)
    static = _static_names(static_args, signature.parameters)
    dtype = check_dtype(hyperparam_dtype, "hyperparam_dtype")
    takes_schedule = _schedulable(inner_factory)
    owner = getattr(inner_factory, "__name__", repr(inner_factory))

    @functools.wraps(inner_factory)
    def wrapped(*args: Any, **kwargs: Any) -> GradientTransformation:
        bound = signature.bind(*args, **kwargs)
        call = f"inject_hyperparams({owner}){call_repr('', bound.arguments)}"
        bound.apply_defaults()
        arguments = _keywords(signature, bound)
        parts: dict[str, dict[str, Any]] = {"fixed": {}, "numbers": {}, "schedules": {}}
        for name, value in arguments.items():
            if name in static or isinstance(value, bool) or not takes_schedule(name):
                if callable(value) and name not in static:
                    raise TypeError(
                        f"{name} of {owner} takes no schedule: give a number "
                        "(inject_hyperparams keeps it fixed)"
                    )
                parts["fixed"][name] = value
            elif callable(value):
                parts["schedules"][name] = value
            else:
                parts["numbers" if _is_number(value) else "fixed"][name] = value
        # the factory's own checks of the initial values (a tensor's stay unread)
        held = {k: Held(v) for k, v in parts["numbers"].items() if isinstance(v, torch.Tensor)}
        inner_factory(**{**arguments, **held})
        for name in _left_out(inner_factory, parts):
            parts["fixed"][name] = parts["numbers"].pop(name)
        return _Inject(
            name="inject_hyperparams", factory=inner_factory, dtype=dtype, call=call, **parts
        ).transformation()

    return wrapped
