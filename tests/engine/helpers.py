"""Shared helpers for the engine tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import optree
import torch

from sbfunc.engine import Algorithm, Context, Event, TrainState
from sbfunc.testing import Toy


def for_algorithms(state: Context | TrainState, algorithms: Sequence[Algorithm]) -> TrainState:
    """A :class:`TrainState` with ``state``'s persistent fields and every algorithm's ``init``
    state (what ``step.init`` stores, without firing ``INIT``)."""
    key = state.key
    return TrainState(
        state.params,
        state.buffers,
        key,
        state.opt_state,
        tuple(a.init(key) for a in algorithms),
        state.time,
    )


def apply_if_matched(
    alg: Algorithm, event: Event, state: Context
) -> tuple[Context | None, object]:
    """What the engine does for one algorithm: ``match``, then ``apply`` with the decision.

    Returns ``(new_state, exit_code)``, or ``(None, None)`` when it did not match.
    """
    decision = alg.match(event, state)
    if not decision:
        return None, None
    out = alg.apply(event, state.replace(matched=decision))
    return (
        (out[0], out[1])
        if isinstance(out, tuple) and not isinstance(out, Context)
        else (out, None)
    )


def logged_tags(own: Any) -> list[Any]:
    """Every tag the :class:`Toy` algorithms in ``own`` logged, flattened in part order."""
    return optree.tree_leaves(own, none_is_leaf=False)


class KeyLog(Toy):
    """A Toy that logs the key it was given (to test random streams)."""

    def apply(self, event: Event, state: Context) -> Context:
        return state.replace(own=(*state.own, state.key.clone()))


def same_keys(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
