"""Algorithm ordering passes (the public ``sbfunc.passes`` module).

A pass is a plain function ``(algorithms, event) -> list`` that reorders the algorithms of an
event; a training step runs a tuple of them once per event when it is built (by default
:data:`DEFAULT_PASSES`: the one rule :func:`order_by_phase`, then a warning). See
:mod:`sbfunc.engine.ordering` for the rule and for Composer's passes.

Example:
    Add your own pass at an index (``sbfunc.testing`` shows how to property-test it):

    >>> from sbfunc.engine import Event
    >>> from sbfunc.passes import DEFAULT_PASSES, register_pass, sort_to_back
    >>> def loss_interpolation_last(algorithms, event):
    ...     return sort_to_back(algorithms, lambda a: a.interpolate_loss)
    >>> passes = register_pass(DEFAULT_PASSES, loss_interpolation_last, index=-1)
    >>> len(passes)
    3
"""

from sbfunc._namespace import api_dir
from sbfunc.engine import ordering as _ordering
from sbfunc.engine.ordering import *  # noqa: F403  (this module is the public face of it)

__all__ = list(_ordering.__all__)


__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
