"""Ordering passes: permutations, stability, idempotence, FILO involution, SB-first, warnings."""

import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sbfunc.engine import (
    DEFAULT_PASSES,
    Event,
    MultipleLossInterpolationWarning,
    order_by_phase,
    phase,
    register_pass,
    set_filo_order,
    sort_fused_layernorm_last,
    sort_selective_backprop_first,
    sort_to_back,
    sort_to_front,
    warn_if_multiple_loss_interpolation,
)
from sbfunc.testing import Toy, algorithm_lists, events

PROPS = settings(max_examples=60, derandomize=True, deadline=None, database=None)
ALL_PASSES = (*DEFAULT_PASSES,)


def run_passes(passes, algs, event):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MultipleLossInterpolationWarning)
        for p in passes:
            algs = p(algs, event)
    return algs


def ids(xs):
    return [id(x) for x in xs]


@PROPS
@given(algorithm_lists(), events(), st.integers(0, len(ALL_PASSES)))
def test_every_pass_and_the_pipeline_permute_without_mutating(algs, event, k):
    before = list(algs)
    passes = ALL_PASSES if k == len(ALL_PASSES) else (ALL_PASSES[k],)
    out = run_passes(passes, algs, event)
    assert sorted(ids(out)) == sorted(ids(algs))
    assert ids(algs) == ids(before) and out is not algs


@PROPS
@given(st.lists(st.integers(0, 9)), st.integers(0, 9))
def test_sort_to_front_and_back_are_stable_and_idempotent(xs, pivot):
    def pred(x):
        return x < pivot

    front, back = sort_to_front(xs, pred), sort_to_back(xs, pred)
    assert front == [x for x in xs if pred(x)] + [x for x in xs if not pred(x)]
    assert back == [x for x in xs if not pred(x)] + [x for x in xs if pred(x)]
    assert sort_to_front(front, pred) == front and sort_to_back(back, pred) == back


def test_sort_to_front_accepts_classes_and_rejects_other_selectors():
    assert sort_to_front([1, "b", 2.0], (str, float)) == ["b", 2.0, 1]
    with pytest.raises(TypeError, match="predicate_or_cls"):
        sort_to_front([1], 3)  # type: ignore[arg-type]


@PROPS
@given(algorithm_lists(), events())
def test_filo_reverses_exactly_the_after_events_and_is_an_involution(algs, event):
    out = set_filo_order(algs, event)
    expected = algs[::-1] if event.name.startswith("AFTER_") else algs
    assert ids(out) == ids(expected)
    assert ids(set_filo_order(out, event)) == ids(algs)


@PROPS
@given(algorithm_lists(), events())
def test_default_pipeline_puts_sample_selection_first_on_every_event(algs, event):
    out = run_passes(DEFAULT_PASSES, algs, event)
    out = [a for a in out if not a.changes_sequence_length]  # those go first (their own rule)
    flags = [a.selects_samples for a in out]
    assert flags == sorted(flags, reverse=True)  # all selectors before all others
    # ... in an order that does not depend on the event (issue 14: NoiseFilter + SB)
    reference = [
        a
        for a in run_passes(DEFAULT_PASSES, algs, Event.BATCH_START)
        if not a.changes_sequence_length
    ]
    assert ids(a for a in out if a.selects_samples) == ids(
        a for a in reference if a.selects_samples
    )


@PROPS
@given(algorithm_lists(), events())
def test_fused_layernorm_last_and_selective_backprop_first_individually(algs, event):
    last = [a.fuses_layernorm for a in sort_fused_layernorm_last(algs, event)]
    first = [a.selects_samples for a in sort_selective_backprop_first(algs, event)]
    assert last == sorted(last) and first == sorted(first, reverse=True)


@PROPS
@given(algorithm_lists(), events())
def test_one_rule_phases_then_list_order_first_in_last_out_on_exactly_the_after_events(
    algs, event
):
    out = order_by_phase(algs, event)
    phases = [phase(a) for a in out]
    assert phases == sorted(phases)
    filo = event.name.startswith("AFTER_")
    for p in range(4):
        in_list = [a for a in algs if phase(a) == p]
        expected = in_list[::-1] if filo and p >= 2 else in_list
        assert ids(a for a in out if phase(a) == p) == ids(expected)


@PROPS
@given(algorithm_lists(), events(), st.data())
def test_ordering_once_then_filtering_equals_ordering_the_matched(algs, event, data):
    keep = data.draw(st.lists(st.booleans(), min_size=len(algs), max_size=len(algs)))
    matched = [a for a, k in zip(algs, keep, strict=True) if k]
    whole = run_passes(DEFAULT_PASSES, algs, event)
    chosen = {id(a) for a in matched}
    assert ids(a for a in whole if id(a) in chosen) == ids(
        run_passes(DEFAULT_PASSES, matched, event)
    )


@PROPS
@given(algorithm_lists(), events())
def test_warns_iff_two_or_more_interpolate_and_never_reorders(algs, event):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = warn_if_multiple_loss_interpolation(algs, event)
    n = sum(a.interpolate_loss for a in algs)
    relevant = [w for w in caught if issubclass(w.category, MultipleLossInterpolationWarning)]
    assert len(relevant) == (1 if n >= 2 else 0)
    assert ids(out) == ids(algs)


def test_composer_example_selective_backprop_first_after_dataloader():
    cutout, resize = Toy(name="CutOut"), Toy(name="ProgressiveResizing")
    sb = Toy(name="SelectiveBackprop", selects_samples=True)
    algs = [cutout, resize, sb]
    composer = [sort_selective_backprop_first, sort_fused_layernorm_last, set_filo_order]
    names = [a.name for a in run_passes(composer, algs, Event.AFTER_DATALOADER)]
    assert names == ["ProgressiveResizing", "CutOut", "SelectiveBackprop"]  # Composer 0.32.1
    names = [a.name for a in run_passes(DEFAULT_PASSES, algs, Event.AFTER_DATALOADER)]
    assert names == ["SelectiveBackprop", "ProgressiveResizing", "CutOut"]


@PROPS
@given(st.integers(-7, 7))
def test_register_pass_is_pure_and_checks_its_index(index):
    def mine(algorithms, event):
        return list(algorithms)

    n = len(DEFAULT_PASSES)
    if -n <= index <= n:
        out = register_pass(DEFAULT_PASSES, mine, index)
        expected = list(DEFAULT_PASSES)
        expected.insert(index, mine)
        assert out == tuple(expected) and len(DEFAULT_PASSES) == n
    else:
        with pytest.raises(ValueError, match="index"):
            register_pass(DEFAULT_PASSES, mine, index)


def test_register_pass_validates():
    assert register_pass((), sort_to_front)[-1] is sort_to_front  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="new_pass"):
        register_pass((), 3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="index"):
        register_pass((), set_filo_order, 1.0)  # type: ignore[arg-type]
