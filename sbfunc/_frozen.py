"""Objects frozen once constructed (algorithms, surgeries), as equinox modules are, and the
one way to derive a changed copy of one (:func:`replaced`)."""

from __future__ import annotations

import copy
import inspect
from abc import ABCMeta
from typing import Any, TypeVar

__all__ = ["Frozen", "replaced"]

_A = TypeVar("_A", bound="Frozen")


class _FrozenAfterInit(ABCMeta):
    """Marks every instance frozen once its class's ``__init__`` has returned."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        instance = super().__call__(*args, **kwargs)
        vars(instance)["_frozen"] = True
        return instance

    @property
    def __signature__(cls) -> inspect.Signature:
        """The constructor's signature, as ``inspect.signature`` reads it without ``__call__``."""
        init = cls.__init__  # type: ignore[misc]
        if init is object.__init__:
            return inspect.Signature()
        sig = inspect.signature(init)
        return sig.replace(parameters=tuple(sig.parameters.values())[1:])


class Frozen(metaclass=_FrozenAfterInit):
    """Base of the objects that are frozen once constructed (algorithms, surgeries): their
    constructor sets their fields, then setting or deleting one raises ``AttributeError``."""

    _frozen_kind: str = ""
    """What the message calls the object (default: its class name)."""
    _frozen_how: str = "its constructor"
    """How the message says to build another."""

    def _frozen_error(self, doing: str) -> AttributeError:
        kind = self._frozen_kind or type(self).__name__
        return AttributeError(
            f"{kind} {getattr(self, 'name', type(self).__name__)!r} is frozen: build a new one "
            f"({self._frozen_how}) instead of {doing}"
        )

    def __setattr__(self, name: str, value: Any) -> None:
        if vars(self).get("_frozen", False):
            raise self._frozen_error(f"setting {name!r}")
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        if vars(self).get("_frozen", False):
            raise self._frozen_error(f"deleting {name!r}")
        super().__delattr__(name)


def replaced(alg: _A, **changes: Any) -> _A:
    """A copy of ``alg`` (frozen like it) with the fields ``changes`` names set to new values.

    The one way ``for_step``, the combinators and :meth:`Algorithm.renamed` derive an algorithm
    from another: ``alg`` itself is never changed. The fields must exist.
    """
    unknown = sorted(k for k in changes if not hasattr(alg, k))
    if unknown:
        raise AttributeError(f"{type(alg).__name__} has no fields {unknown} to replace")
    new = copy.copy(alg)
    vars(new).update(changes)
    return new
