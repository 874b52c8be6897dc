"""Selective Backprop: score every row of a batch, keep the useful ones, backpropagate those.

:class:`SelectiveBackprop` is the algorithm (Composer's, on ``AFTER_DATALOADER``), with its
schedule :func:`should_selective_backprop`. Underneath, :func:`apply_policy` runs one
selection policy (:mod:`sbfunc.policies`) on one batch and prunes it (:class:`Pruned`), and the
refill queue (:class:`Queue`, :func:`empty_queue`, :func:`enqueue`, :func:`dequeue`,
:func:`flush`) collects kept rows across batches until a full batch is ready.

For language models, :class:`TokenSelection` selects *tokens* (selective language modeling,
Rho-1): the training forward's token losses, minus a reference model's, rank the tokens of a
batch, and only the kept ones are backpropagated. The reference runs inside the step
(:func:`reference_model`) or is a table computed once (:func:`reference_losses`) and streamed
with the batches (:func:`reference_field`); it gives losses, the one sign convention of every
reference in sbfunc.
"""

from sbfunc._namespace import api_dir
from sbfunc.selective_backprop._algorithm import SelectiveBackprop
from sbfunc.selective_backprop._apply import Pruned, apply_policy
from sbfunc.selective_backprop._candidates import candidate_batch_size
from sbfunc.selective_backprop._queue import Queue, dequeue, empty_queue, enqueue, flush
from sbfunc.selective_backprop._reference import (
    ModelReference,
    Reference,
    ReferenceState,
    TableReference,
    reference_field,
    reference_losses,
    reference_model,
)
from sbfunc.selective_backprop._tokens import TokenSelection, kept_tokens
from sbfunc.selective_backprop._window import should_selective_backprop

__all__ = [
    "ModelReference",
    "Pruned",
    "Queue",
    "Reference",
    "ReferenceState",
    "SelectiveBackprop",
    "TableReference",
    "TokenSelection",
    "apply_policy",
    "candidate_batch_size",
    "dequeue",
    "empty_queue",
    "enqueue",
    "flush",
    "kept_tokens",
    "reference_field",
    "reference_losses",
    "reference_model",
    "should_selective_backprop",
]


__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
