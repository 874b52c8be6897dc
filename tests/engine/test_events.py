"""Events: Composer's 40 members, order, values and classification."""

import enum

import torch
from hypothesis import given, settings

from sbfunc.engine import Event
from sbfunc.testing import events

COMPOSER_ORDER = [
    "INIT",
    "BEFORE_LOAD",
    "AFTER_LOAD",
    "FIT_START",
    "ITERATION_START",
    "EPOCH_START",
    "BEFORE_DATALOADER",
    "AFTER_DATALOADER",
    "BATCH_START",
    "BEFORE_TRAIN_BATCH",
    "BEFORE_FORWARD",
    "AFTER_FORWARD",
    "BEFORE_LOSS",
    "AFTER_LOSS",
    "BEFORE_BACKWARD",
    "AFTER_BACKWARD",
    "AFTER_TRAIN_BATCH",
    "BATCH_END",
    "BATCH_CHECKPOINT",
    "EPOCH_END",
    "EPOCH_CHECKPOINT",
    "ITERATION_END",
    "ITERATION_CHECKPOINT",
    "FIT_END",
    "EVAL_BEFORE_ALL",
    "EVAL_START",
    "EVAL_BATCH_START",
    "EVAL_BEFORE_FORWARD",
    "EVAL_AFTER_FORWARD",
    "EVAL_BATCH_END",
    "EVAL_END",
    "EVAL_AFTER_ALL",
    "EVAL_STANDALONE_START",
    "EVAL_STANDALONE_END",
    "PREDICT_START",
    "PREDICT_BATCH_START",
    "PREDICT_BEFORE_FORWARD",
    "PREDICT_AFTER_FORWARD",
    "PREDICT_BATCH_END",
    "PREDICT_END",
]

FILO = {"AFTER_LOAD", "AFTER_DATALOADER", "AFTER_FORWARD", "AFTER_LOSS", "AFTER_BACKWARD"}
FILO |= {"AFTER_TRAIN_BATCH"}


def test_members_order_and_values_are_composers():
    assert [e.name for e in Event] == COMPOSER_ORDER
    assert all(e.value == e.name.lower() for e in Event)


def test_neither_before_nor_after_are_init_and_checkpoints():
    neither = {e.name for e in Event if not (e.is_before_event or e.is_after_event)}
    assert neither == {"INIT", "BATCH_CHECKPOINT", "EPOCH_CHECKPOINT", "ITERATION_CHECKPOINT"}
    assert {e.name for e in Event if e.value.startswith("after_")} == FILO


@settings(max_examples=40, derandomize=True, deadline=None, database=None)
@given(events())
def test_classification_laws(event):
    assert not (event.is_before_event and event.is_after_event)
    assert event.is_eval == event.name.startswith("EVAL")
    assert event.is_predict == event.name.startswith("PREDICT")
    name = event.canonical_name
    assert not name.startswith(("before_", "after_")) and not name.endswith(("_start", "_end"))
    # Hash is consistent with equality and lookups by value still work.
    assert {event: 1}[Event(event.value)] == 1
    assert hash(event) == hash(Event[event.name])


def test_events_hash_as_every_enum_member_does():
    """Enum's own hash (by name), no ``__hash__`` of Event's: torch 2.11's dynamo refuses to
    hash an object whose class defines one, and the compiled step looks events up in dicts."""
    assert "__hash__" not in vars(Event)
    assert all(hash(e) == enum.Enum.__hash__(e) == hash(e.name) for e in Event)


def test_a_dict_and_a_set_keyed_by_events_compile_fullgraph():
    index = {e: i for i, e in enumerate(Event)}
    after = {e for e in Event if e.is_after_event}

    def lookup(x, event):
        return x * index[event] + (event in after)

    compiled = torch.compile(lookup, fullgraph=True, backend="eager")
    for event in (Event.AFTER_LOSS, Event.BEFORE_LOSS):
        assert torch.equal(compiled(torch.ones(2), event), lookup(torch.ones(2), event))


def test_pairs_share_canonical_names():
    assert Event.BEFORE_LOSS.canonical_name == Event.AFTER_LOSS.canonical_name == "loss"
    assert Event.EPOCH_START.canonical_name == Event.EPOCH_END.canonical_name == "epoch"
    assert Event.EVAL_BEFORE_ALL.canonical_name == "eval_all"
