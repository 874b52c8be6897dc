"""Compatibility layers for other libraries' APIs."""

from sbfunc.compat import composer
from sbfunc.compat.composer import select_using_loss, should_selective_backprop

__all__ = ["composer", "select_using_loss", "should_selective_backprop"]


def __dir__() -> list[str]:  # dir() lists the public API, not the module's imports
    return sorted(__all__)
