"""``sbfunc._tracing``: whether code may read a tensor on the host (a plain eager CPU tensor),
and the engine's tuples copying themselves through their constructor
(``replace_by_constructor``): the standard ``_replace``'s values and errors, and a copy that
survives a compiled frame."""

from typing import NamedTuple

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sbfunc._tracing import host_readable, replace_by_constructor
from sbfunc.engine import Carry, Context, Time, TrainState
from sbfunc.testing import states, train_states

FAST = settings(max_examples=25, derandomize=True, deadline=None, database=None)


class Plain(NamedTuple):
    a: int = 0
    b: int = 1
    c: int = 2


@replace_by_constructor
class Copied(NamedTuple):
    a: int = 0
    b: int = 1
    c: int = 2


def test_the_engine_tuples_replace_through_their_constructor():
    for cls in (Time, TrainState, Context, Carry):
        assert cls._replace.__qualname__.startswith("replace_by_constructor"), cls


@FAST
@given(changes=st.dictionaries(st.sampled_from(Plain._fields), st.integers(-5, 5), max_size=3))
def test_the_copy_and_the_error_are_the_standard_replaces(changes):
    assert tuple(Copied()._replace(**changes)) == tuple(Plain()._replace(**changes))
    assert type(Copied()._replace(**changes)) is Copied
    for bad in ({"d": 1}, {**changes, "zz": 0}):
        with pytest.raises(ValueError) as theirs:
            Plain()._replace(**bad)
        with pytest.raises(ValueError) as ours:
            Copied()._replace(**bad)
        assert str(ours.value) == str(theirs.value)


@FAST
@given(ctx=states(), state=train_states())
def test_engine_states_copy_every_field(ctx, state):
    new = ctx.replace(loss=torch.tensor(3.0), samples_scored=7)
    assert type(new) is Context and new.loss == 3.0 and new.samples_scored == 7
    kept = [f for f in ctx._fields if f not in ("loss", "samples_scored")]
    assert all(getattr(new, f) is getattr(ctx, f) for f in kept)
    moved = state.replace(opt_state=(1,))
    assert type(moved) is TrainState and moved.opt_state == (1,)
    assert all(getattr(moved, f) is getattr(state, f) for f in state._fields if f != "opt_state")


def test_a_copy_returned_or_held_across_a_graph_break_compiles_whole():
    """torch 2.11 rebuilt a standard ``_replace``'s copy as an empty tuple at a frame's return
    and at a graph break (``tuple.__new__`` of a ``map`` its tracer had consumed)."""

    def returned(t: Time, x: torch.Tensor) -> tuple[Time, torch.Tensor]:
        return t._replace(step=t.step + 1), x + 1

    def held(t: Time, x: torch.Tensor) -> tuple[Time, torch.Tensor]:
        new = t._replace(epoch=3)
        torch._dynamo.graph_break()
        return new, x + 1

    for fn in (returned, held):
        torch._dynamo.reset()
        t, x = Time(step=1, total_steps=4), torch.zeros(2)
        got, y = torch.compile(fn, backend="eager")(t, x)
        assert type(got) is Time and got == fn(t, x)[0] and torch.equal(y, x + 1)


def test_host_readable_only_for_plain_eager_cpu_tensors():
    t = torch.tensor([1, 2])
    assert host_readable(t)
    assert not host_readable(torch.empty(2, device="meta"))
    seen = []
    torch.func.vmap(lambda x: seen.append(host_readable(t)) or x)(torch.zeros(2))
    assert seen == [False]
