"""What ``dir()`` shows of a public module, and the one-release aliases of moved names."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import ModuleType
from typing import Any, NamedTuple, Union

__all__ = ["REMOVED_IN", "Namespace", "Spelling", "api_dir", "deprecated", "moved_names"]

REMOVED_IN = "1.3"
"""The release that removes the aliases: of the names moved in 1.1 (kept one release longer,
as 1.1 missed some) and of those moved in 1.2."""


def api_dir(names: Sequence[str]) -> Callable[[], list[str]]:
    """A module-level ``__dir__`` listing ``names`` (the module's ``__all__``), sorted."""
    listed = sorted(names)

    def __dir__() -> list[str]:
        return list(listed)

    return __dir__


class Namespace(NamedTuple):
    """A public module that is gone: getting it gives a namespace whose names warn and resolve
    to where each one moved (``moves``, as in :func:`moved_names`)."""

    moves: Moves


class Spelling(NamedTuple):
    """An old spelling with no name in the new API (``apply_blurpool(model)``, now
    ``BlurPool()(model)``): getting it warns, naming ``new``, and gives the object at ``old``
    (``"module:attr"``), which does what it did."""

    old: str
    new: str


Moves = Union[  # noqa: UP007
    Mapping[str, Union[str, Namespace, Spelling]], tuple[str, Iterable[str]]  # noqa: UP007
]
"""Old name -> ``"home.module:NewName"`` (or a :class:`Namespace` for a module that is gone, a
:class:`Spelling` for a name with no new one), or ``(home, names)`` for names that kept their
name."""


def deprecated(old: str, new: str, since: str, *, stacklevel: int = 2) -> None:
    """Warn that the spelling ``old`` is deprecated since ``since``: write ``new`` (a
    ``DeprecationWarning`` pointing at the caller's caller, removed in :data:`REMOVED_IN`)."""
    warnings.warn(
        f"{old} is deprecated since sbfunc {since}: write {new}; the old spelling is removed in "
        f"{REMOVED_IN}",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )


def _table(moves: Moves) -> dict[str, str | Namespace | Spelling]:
    if isinstance(moves, tuple):
        home, names = moves
        return {name: f"{home}:{name}" for name in names}
    return dict(moves)


def _homes(target: str | Namespace | Spelling) -> tuple[str, set[str]]:
    """The new spelling of a moved name, and the modules it names."""
    if isinstance(target, str):
        module, _, attr = target.partition(":")
        return f"{module}.{attr}", {module}
    if isinstance(target, Spelling):
        return target.new, set()
    homes = set().union(*(_homes(t)[1] for t in _table(target.moves).values()))
    return " and ".join(sorted(homes)), homes


def _namespace(name: str, since: str, moves: Moves) -> ModuleType:
    shim = ModuleType(name, f"Gone since sbfunc {since}: every name warns and resolves.")
    shim.__getattr__ = moved_names(name, (since, moves))  # type: ignore[method-assign]
    shim.__dir__ = api_dir(())  # type: ignore[method-assign]
    return shim


def moved_names(
    owner: str, *groups: tuple[str, Moves], lazy: Iterable[str] = ()
) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for the public names that moved away from ``owner``, and
    for its ``lazy`` sub-packages (imported on first use, silently).

    ``groups`` are ``(release, moves)`` pairs: the release that moved the names, and the names
    (:data:`Moves`). Getting an old name from module ``owner`` warns (``DeprecationWarning``,
    pointing at the caller, naming the new home) and returns the new one; a module that is gone
    (:class:`Namespace`) comes back as a namespace whose names warn in turn, and a spelling with
    no new name (:class:`Spelling`) warns naming the new call and gives the old object. The
    aliases are in neither ``__all__`` nor ``dir()`` and are removed in :data:`REMOVED_IN` (the
    CHANGELOG's migration tables list them). Any other missing name raises ``AttributeError``
    as usual.
    """
    table = {name: (since, t) for since, moves in groups for name, t in _table(moves).items()}
    shims: dict[str, ModuleType] = {}
    submodules = frozenset(lazy)

    def __getattr__(name: str) -> Any:
        if name in submodules:  # importing it sets the attribute: this runs once
            return importlib.import_module(f"{owner}.{name}")
        if name not in table:
            raise AttributeError(f"module {owner!r} has no attribute {name!r}")
        since, target = table[name]
        if isinstance(target, Spelling):
            deprecated(f"{owner}.{name}", target.new, since)
            module, _, attr = target.old.partition(":")
            return getattr(importlib.import_module(module), attr)
        new, _ = _homes(target)
        renamed = isinstance(target, str) and not target.endswith(f":{name}")
        warnings.warn(
            f"{owner}.{name} {'was renamed' if renamed else 'moved'} to {new} in sbfunc "
            f"{since}; the old name is removed in {REMOVED_IN}",
            DeprecationWarning,
            stacklevel=2,
        )
        if isinstance(target, Namespace):
            if name not in shims:
                shims[name] = _namespace(f"{owner}.{name}", since, target.moves)
            return shims[name]
        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)

    return __getattr__
