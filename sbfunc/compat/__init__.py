"""Compatibility layers for other libraries' APIs: Composer's functional Selective Backprop
(:func:`select_using_loss`, :func:`should_selective_backprop`), fixed and validated."""

from sbfunc._namespace import api_dir
from sbfunc.compat._composer import select_using_loss
from sbfunc.selective_backprop import should_selective_backprop

__all__ = ["select_using_loss", "should_selective_backprop"]


__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
