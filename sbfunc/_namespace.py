"""What ``dir()`` shows of a public module: its API, not the names it imports."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["api_dir", "deprecated_aliases"]


def api_dir(names: Sequence[str]) -> Callable[[], list[str]]:
    """A module-level ``__dir__`` listing ``names`` (the module's ``__all__``), sorted.

    Example:
        >>> from sbfunc._namespace import api_dir
        >>> api_dir(["take", "batch_size"])()
        ['batch_size', 'take']
    """
    listed = sorted(names)

    def __dir__() -> list[str]:
        return list(listed)

    return __dir__


def deprecated_aliases(owner: str, table: Mapping[str, str]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for the names of 0.3 that moved or were renamed.

    ``table`` maps an old name to ``"home.module:NewName"``; getting the old name from module
    ``owner`` warns (``DeprecationWarning``, pointing at the caller) and returns the new one.
    The aliases are not in ``__all__`` nor ``dir()``; they are removed in 1.1.

    Example:
        >>> import warnings
        >>> getattr_ = deprecated_aliases("pkg", {"old": "sbfunc.batch:take"})
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     getattr_("old") is sbfunc.batch.take
        True
        >>> str(caught[0].message)
        'pkg.old was renamed to sbfunc.batch.take; the alias will be removed in 1.1'
    """
    aliases = dict(table)

    def __getattr__(name: str) -> Any:
        target = aliases.get(name)
        if target is None:
            raise AttributeError(f"module {owner!r} has no attribute {name!r}")
        module, _, attr = target.partition(":")
        change = "moved" if attr == name else "was renamed"
        warnings.warn(
            f"{owner}.{name} {change} to {module}.{attr}; the alias will be removed in 1.1",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(module), attr)

    return __getattr__
