"""Compatibility layers for other libraries' APIs."""

from sbfunc._namespace import api_dir
from sbfunc.compat import composer
from sbfunc.compat.composer import select_using_loss, should_selective_backprop

__all__ = ["composer", "select_using_loss", "should_selective_backprop"]


__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
