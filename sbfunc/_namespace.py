"""What ``dir()`` shows of a public module: its API, not the names it imports."""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["api_dir"]


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
