"""What ``dir()`` shows of a public module, and the one-release aliases of moved names."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

__all__ = ["api_dir", "moved_names"]


def api_dir(names: Sequence[str]) -> Callable[[], list[str]]:
    """A module-level ``__dir__`` listing ``names`` (the module's ``__all__``), sorted."""
    listed = sorted(names)

    def __dir__() -> list[str]:
        return list(listed)

    return __dir__


def moved_names(
    owner: str, moves: Mapping[str, str] | tuple[str, Iterable[str]]
) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for the public names that moved in 1.1.

    ``moves`` maps an old name to ``"home.module:NewName"``, or is ``(home, names)`` for names
    that kept their name. Getting an old name from module ``owner`` warns
    (``DeprecationWarning``, pointing at the caller) and returns the new one; the aliases are
    in neither ``__all__`` nor ``dir()`` and are removed in 1.2 (the CHANGELOG's 1.1 migration
    table lists them). Any other missing name raises ``AttributeError`` as usual.
    """
    if isinstance(moves, tuple):
        home, names = moves
        moves = {name: f"{home}:{name}" for name in names}
    table = dict(moves)

    def __getattr__(name: str) -> Any:
        target = table.get(name)
        if target is None:
            raise AttributeError(f"module {owner!r} has no attribute {name!r}")
        module, _, attr = target.partition(":")
        change = "moved" if attr == name else "was renamed"
        warnings.warn(
            f"{owner}.{name} {change} to {module}.{attr} in sbfunc 1.1; the old name is removed "
            "in 1.2",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(module), attr)

    return __getattr__
