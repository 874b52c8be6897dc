"""The engine: match once, order by passes, apply in order, trace every application."""

import warnings

import pytest
from hypothesis import given, settings

from sbfunc.engine import Algorithm, Event, run_event
from sbfunc.passes import DEFAULT_PASSES, MultipleLossInterpolationWarning
from sbfunc.testing import LOG, Toy, algorithm_lists, events, states

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
        return run_event(event, state, algs, passes)


@PROPS
@given(algorithm_lists(), events(), states(with_batch=False))
def test_traces_follow_application_order_and_names_are_unique(algs, event, state):
    new, traces = run(event, state, algs)
    applied = new.algorithm_state.get(LOG, ())
    assert [t.order for t in traces] == list(range(len(traces)))
    assert len(traces) == len(applied) == sum(a.match(event, state) for a in algs)
    assert len({t.name for t in traces}) == len(traces)
    by_tag = {a.tag: a for a in algs}
    assert [t.exit_code for t in traces] == [by_tag[tag].exit_code for tag in applied]
    assert all(t.event is event for t in traces)
    assert LOG not in state.algorithm_state  # the input state is untouched


@PROPS
@given(algorithm_lists(), events(), states(with_batch=False))
def test_match_is_called_exactly_once_per_algorithm(algs, event, state):
    counts = {}
    counting = [Counting(counts, tag=a.tag, events=a.events, name=a.name) for a in algs]
    run(event, state, counting)
    assert counts == {a.tag: 1 for a in algs}


@PROPS
@given(algorithm_lists(), events(), states(with_batch=False))
def test_application_order_is_the_pass_pipeline_order(algs, event, state):
    new, _ = run(event, state, algs)
    matched = [a for a in algs if a.match(event, state)]
    for p in DEFAULT_PASSES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            matched = p(matched, event)
    assert new.algorithm_state.get(LOG, ()) == tuple(a.tag for a in matched)


def test_repeated_names_and_objects_get_positional_labels(state0):
    a = Toy(tag=0)
    algs = [a, Toy(tag=1), a]
    _, traces = run_event(Event.BATCH_END, state0, algs)
    assert [t.name for t in traces] == ["Toy", "Toy#1", "Toy#2"]
    _, traces = run_event(Event.AFTER_LOSS, state0, algs)  # reversed by FILO
    assert sorted(t.name for t in traces) == ["Toy", "Toy#1", "Toy#2"]


def test_passes_see_only_matched_algorithms_and_none_when_nothing_matched(state0):
    seen = []

    def spy(algorithms, event):
        seen.append([a.tag for a in algorithms])
        return list(algorithms)

    algs = [Toy(tag=0, events=[Event.INIT]), Toy(tag=1, events=[Event.FIT_END])]
    run_event(Event.INIT, state0, algs, (spy,))
    run_event(Event.BATCH_END, state0, algs, (spy,))
    assert seen == [[0]]


def test_validation(state0):
    with pytest.raises(TypeError, match="event"):
        run_event("init", state0, [])  # type: ignore[arg-type]

    class Bad(Algorithm):
        def match(self, event, state):
            return True

        def apply(self, event, state):
            return 3

    with pytest.raises(TypeError, match=r"Bad\.apply"):
        run_event(Event.INIT, state0, [Bad()])


def test_selective_backprop_runs_first_on_after_dataloader(state0):
    algs = [Toy(tag=0, name="CutOut"), Toy(tag=1, name="ProgressiveResizing")]
    algs.append(Toy(tag=2, name="SelectiveBackprop", selects_samples=True))
    new, traces = run_event(Event.AFTER_DATALOADER, state0, algs)
    assert [t.name for t in traces] == ["SelectiveBackprop", "ProgressiveResizing", "CutOut"]
    assert new.algorithm_state[LOG] == (2, 1, 0)
