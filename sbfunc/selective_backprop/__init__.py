"""Selective Backprop: score every row of a batch, keep the useful ones, backpropagate those.

:class:`SelectiveBackprop` is the algorithm (Composer's, on ``AFTER_DATALOADER``), with its
schedule :func:`should_selective_backprop`. Underneath, :func:`apply_policy` runs one
selection policy (:mod:`sbfunc.policies`) on one batch and prunes it (:class:`Pruned`), and the
refill queue (:class:`Queue`, :func:`empty_queue`, :func:`enqueue`, :func:`dequeue`,
:func:`flush`) collects kept rows across batches until a full batch is ready.
"""

from sbfunc._namespace import api_dir
from sbfunc.selective_backprop._algorithm import SelectiveBackprop
from sbfunc.selective_backprop._apply import Pruned, apply_policy
from sbfunc.selective_backprop._queue import Queue, dequeue, empty_queue, enqueue, flush
from sbfunc.selective_backprop._window import should_selective_backprop

__all__ = [
    "Pruned",
    "Queue",
    "SelectiveBackprop",
    "apply_policy",
    "dequeue",
    "empty_queue",
    "enqueue",
    "flush",
    "should_selective_backprop",
]


__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
