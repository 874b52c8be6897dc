"""The engine: match once, order by passes, apply in order, trace every application."""

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc.engine import (
    DEFAULT_PASSES,
    Algorithm,
    Event,
    MultipleLossInterpolationWarning,
    Time,
    run_event,
)
from sbfunc.testing import Toy, algorithm_lists, applied, events, states
from tests.engine.helpers import KeyLog, for_algorithms, same_keys

PROPS = settings(max_examples=60, derandomize=True, deadline=None, database=None)


class Counting(Toy):
    """A Toy that counts its ``match`` calls in a shared dict (test-only side effect)."""

    def __init__(self, counts, **kwargs):
        super().__init__(**kwargs)
        self.counts = counts

    def match(self, event, state):
        self.counts[self.tag] = self.counts.get(self.tag, 0) + 1
        return super().match(event, state)


def run(event, state, algs, passes=DEFAULT_PASSES):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MultipleLossInterpolationWarning)
        return run_event(event, for_algorithms(state, algs), algs, passes)


@PROPS
@given(algorithm_lists(), events(), states(with_batch=False))
def test_traces_follow_application_order_and_names_are_unique(algs, event, state):
    train = for_algorithms(state, algs)
    new, traces = run(event, state, algs)
    order = applied(traces, algs)
    assert [t.order for t in traces] == list(range(len(traces)))
    assert len(traces) == sum(bool(a.match(event, state)) for a in algs)
    assert len({t.name for t in traces}) == len(traces) == len(set(order))
    assert [t.exit_code for t in traces] == [algs[i].exit_code for i in order]
    assert all(t.event is event for t in traces)
    # the state mirrors the list: each algorithm logged into its own entry only
    assert new.algorithm_state == tuple((a.tag,) if i in order else () for i, a in enumerate(algs))
    assert train.algorithm_state == ((),) * len(algs)  # the input state is untouched
    assert new.time == state.time and new.key is state.key


@PROPS
@given(algorithm_lists(), events(), states(with_batch=False))
def test_match_is_called_once_per_algorithm_that_listens_to_the_event(algs, event, state):
    counts = {}
    counting = [Counting(counts, tag=a.tag, events=a.events, name=a.name) for a in algs]
    run(event, state, counting)
    # Algorithm.events declares what match can accept: the engine never asks about the rest
    assert counts == {a.tag: 1 for a in algs if a.events is None or event in a.events}


@PROPS
@given(algorithm_lists(), events(), states(with_batch=False))
def test_application_order_is_the_pass_pipeline_order(algs, event, state):
    _, traces = run(event, state, algs)
    matched = [a for a in algs if a.match(event, state)]
    for p in DEFAULT_PASSES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            matched = p(matched, event)
    assert applied(traces, algs) == [a.tag for a in matched]  # tags are positions


def test_repeated_names_and_objects_get_positional_labels(train0):
    a = Toy(tag=0)
    algs = [a, Toy(tag=1), a]
    state = for_algorithms(train0, algs)
    new, traces = run_event(Event.BATCH_END, state, algs)
    assert [t.name for t in traces] == ["Toy", "Toy#1", "Toy#2"]
    assert new.algorithm_state == ((0,), (1,), (0,))  # one entry per position, not per object
    _, traces = run_event(Event.AFTER_LOSS, state, algs)  # reversed by FILO
    assert sorted(t.name for t in traces) == ["Toy", "Toy#1", "Toy#2"]
    assert applied(traces, algs)[1] == 1  # passes see objects: the two a's are alike to them


def test_passes_see_the_algorithms_listening_to_the_event_and_none_when_none_does(train0):
    seen = []

    def spy(algorithms, event):
        seen.append([a.tag for a in algorithms])
        return list(algorithms)

    algs = [Toy(tag=0, events=[Event.INIT]), Toy(tag=1, events=[Event.FIT_END])]
    state = for_algorithms(train0, algs)
    run_event(Event.INIT, state, algs, (spy,))
    run_event(Event.BATCH_END, state, algs, (spy,))
    assert seen == [[0]]


def test_a_pass_may_only_reorder(train0):
    algs = [Toy(tag=0, events=[Event.INIT]), Toy(tag=1, events=[Event.FIT_END])]
    with pytest.raises(ValueError, match="passes may only reorder"):
        run_event(Event.INIT, for_algorithms(train0, algs), algs, (lambda a, e: [algs[1]],))


def test_validation(train0):
    with pytest.raises(TypeError, match="event"):
        run_event("init", train0, [])  # type: ignore[arg-type]

    class Bad(Algorithm):
        def match(self, event, state):
            return True

        def apply(self, event, state):
            return 3

    with pytest.raises(TypeError, match=r"Bad\.apply"):
        run_event(Event.INIT, for_algorithms(train0, [Bad()]), [Bad()])
    with pytest.raises(ValueError, match="algorithm_state has 0 entries for 1 algorithms"):
        run_event(Event.INIT, train0, [Toy()])


def test_selective_backprop_runs_first_on_after_dataloader(train0):
    algs = [Toy(tag=0, name="CutOut"), Toy(tag=1, name="ProgressiveResizing")]
    algs.append(Toy(tag=2, name="SelectiveBackprop", selects_samples=True))
    new, traces = run_event(Event.AFTER_DATALOADER, for_algorithms(train0, algs), algs)
    assert [t.name for t in traces] == ["SelectiveBackprop", "ProgressiveResizing", "CutOut"]
    assert new.algorithm_state == ((0,), (1,), (2,))


def _key_of(algs, index, event=Event.BATCH_END, step=0):
    state = for_algorithms(sbfunc.TrainState({}, {}, sbfunc.random.key(3)), algs)
    new, _ = run_event(event, state.replace(time=Time(step=step)), algs)
    return new.algorithm_state[index]


def test_an_algorithms_key_depends_on_its_name_rank_step_and_event_only():
    probe = KeyLog(name="probe")
    alone = _key_of([probe], 0)
    assert len(alone) == 1
    assert same_keys(_key_of([Toy(name="x"), probe], 1), alone)  # adding another algorithm
    assert same_keys(_key_of([probe, KeyLog(name="y")], 0), alone)  # ... after it
    assert same_keys(_key_of([Toy(), probe, Toy()], 1), alone)
    assert not same_keys(_key_of([probe, probe], 1), alone)  # the second "probe" has rank 1
    assert same_keys(_key_of([Toy(), probe, probe], 2), _key_of([probe, probe], 1))
    assert not same_keys(_key_of([probe], 0, step=1), alone)
    assert not same_keys(_key_of([probe], 0, event=Event.EPOCH_END), alone)
    assert not same_keys(alone, [sbfunc.random.key(3)])  # never the root key itself


class ScratchProbe(Algorithm):
    """Logs the scratch it starts each application with, then leaves some behind."""

    def init(self, key):
        return ()

    def match(self, event, state):
        return True

    def apply(self, event, state):
        return state.replace(own=(*state.own, state.scratch), scratch=torch.ones(1))


@PROPS
@given(st.lists(events(), min_size=1, max_size=4), states(with_batch=False))
def test_scratch_is_none_at_every_event_outside_the_step(evts, state):
    algs = [ScratchProbe(), ScratchProbe()]
    train = for_algorithms(state, algs)
    for event in evts:
        train, _ = run_event(event, train, algs)
    assert train.algorithm_state == ((None,) * len(evts),) * 2
    assert "scratch" not in sbfunc.TrainState._fields
