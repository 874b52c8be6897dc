"""Combinator laws: sequence identity and associativity, state mirroring, gates, flags, streams."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc.engine import (
    FLAGS,
    Event,
    Time,
    during,
    every_n_steps,
    named_sequence,
    on_events,
    run_event,
    sequence,
    when,
)
from sbfunc.testing import Toy, algorithm_lists, algorithms, events, states
from tests.engine.helpers import KeyLog, apply_if_matched, for_algorithms, logged_tags, same_keys

PROPS = settings(max_examples=50, derandomize=True, deadline=None, database=None)


def effect(alg, event, state):
    """``(tags logged, exit code)`` of one engine-style application, or ``None``."""
    out, code = apply_if_matched(alg, event, state.replace(own=alg.init(state.key)))
    return None if out is None else (logged_tags(out.own), code)


@PROPS
@given(events(), states(with_batch=False))
def test_empty_chain_never_matches_and_has_no_state(event, state):
    empty = sequence()
    assert not empty.match(event, state.replace(own=empty.init(state.key)))
    assert empty.init(state.key) == () and empty.parts == ()
    assert all(getattr(empty, f) is False for f in FLAGS)
    train = for_algorithms(state, [empty])
    assert run_event(event, train, [empty]) == (train, ())


@PROPS
@given(algorithm_lists(max_size=6), events(), states(with_batch=False), st.data())
def test_chain_is_associative_in_effect(algs, event, state, data):
    i = data.draw(st.integers(0, len(algs)))
    j = data.draw(st.integers(i, len(algs)))
    a, b, c = algs[:i], algs[i:j], algs[j:]
    left = sequence(sequence(*a), sequence(*b), sequence(*c))
    flat = sequence(*algs)
    right = sequence(*a, sequence(*b, *c))
    assert effect(left, event, state) == effect(flat, event, state) == effect(right, event, state)
    for f in FLAGS:
        assert getattr(flat, f) == any(getattr(x, f) for x in algs)


@PROPS
@given(algorithm_lists(max_size=5), events(), states(with_batch=False))
def test_chain_state_mirrors_its_parts_and_parts_are_not_copied(algs, event, state):
    before = [a.name for a in algs]
    combined = sequence(*algs)
    assert list(map(id, combined.parts)) == list(map(id, algs))
    assert combined.init(state.key) == tuple(a.init(state.key) for a in algs)
    out, _ = apply_if_matched(combined, event, state.replace(own=combined.init(state.key)))
    if out is not None:  # each part's own entry holds exactly its own log
        assert out.own == tuple((a.tag,) if a.match(event, state) else () for a in algs)
    assert [a.name for a in algs] == before  # no renaming


def test_chain_reports_the_last_exit_code(view0):
    combined = sequence(Toy(tag=0, exit_code=1), Toy(tag=1), Toy(tag=2, exit_code=2))
    out, code = apply_if_matched(combined, Event.INIT, view0.replace(own=combined.init(view0.key)))
    assert code == 2 and out.own == ((0,), (1,), (2,))


def test_chain_passes_each_part_its_decision_and_skips_unmatched_parts(view0):
    combined = sequence(Toy(tag=0, events=[Event.INIT]), Toy(tag=1, events=[Event.FIT_END]))
    state = view0.replace(own=combined.init(view0.key))
    assert combined.match(Event.INIT, state) == (True, False)
    assert combined.match(Event.EPOCH_END, state) is False
    out, _ = apply_if_matched(combined, Event.INIT, state)
    assert out.own == ((0,), ()) and out.matched == (True, False)


def test_named_chain_state_is_a_dict_by_name(view0):
    combined = named_sequence(("x", Toy(tag=0)), y=Toy(tag=1, name="keep"))
    assert [p.name for p in combined.parts] == ["Toy", "keep"]  # parts keep their own names
    assert combined.init(view0.key) == {"x": (), "y": ()}
    out, _ = apply_if_matched(combined, Event.INIT, view0.replace(own=combined.init(view0.key)))
    assert out.own == {"x": (0,), "y": (1,)}
    with pytest.raises(ValueError, match="unique"):
        named_sequence(("x", Toy()), x=Toy())
    with pytest.raises(TypeError, match="pairs"):
        named_sequence(Toy())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Algorithm"):
        sequence(Toy(), object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="name"):
        sequence(Toy(), name="")


def _part_keys(combined, index, view):
    out, _ = apply_if_matched(combined, Event.INIT, view.replace(own=combined.init(view.key)))
    own = out.own if isinstance(out.own, tuple) else tuple(out.own.values())
    return own[index]


def test_a_parts_key_does_not_depend_on_its_siblings(view0):
    probe = KeyLog(name="probe")
    alone = _part_keys(sequence(probe), 0, view0)
    assert same_keys(_part_keys(sequence(Toy(name="other"), probe), 1, view0), alone)
    assert same_keys(_part_keys(sequence(probe, KeyLog(name="B")), 0, view0), alone)
    # two parts of the same name draw from different streams; the sequence's key is not reused
    twins = (
        _part_keys(sequence(probe, probe), 0, view0),
        _part_keys(sequence(probe, probe), 1, view0),
    )
    assert not same_keys(*twins) and not same_keys(alone, [view0.key])
    named = _part_keys(named_sequence(a=probe, b=probe), 0, view0)
    assert same_keys(named, _part_keys(named_sequence(z=Toy(), a=probe), 1, view0))


@PROPS
@given(algorithms(), events(), states(with_batch=False), st.frozensets(events(), max_size=5))
def test_on_events_law(alg, event, state, allowed):
    gated = on_events(alg, allowed)
    assert gated.match(event, state) == (event in allowed and alg.match(event, state))
    assert gated.name == alg.name and gated.parts == (alg,)
    assert all(getattr(gated, f) == getattr(alg, f) for f in FLAGS)
    assert gated.init(state.key) == alg.init(state.key)  # transparent: same state


@PROPS
@given(algorithm_lists(), events(), states(with_batch=False), st.floats(0, 1))
def test_never_active_window_never_applies(algs, event, state, point):
    gated = [during(a, point, point) for a in algs]
    train = for_algorithms(state, gated)
    new, traces = run_event(event, train, gated, passes=())
    assert traces == () and new is train


@PROPS
@given(algorithms(), events(), states(with_batch=False), st.floats(0, 1), st.floats(0, 1))
def test_during_law(alg, event, state, x, y):
    start, end = min(x, y), max(x, y)
    gated = during(alg, start, end)
    active = start <= state.time.elapsed < end
    assert gated.match(event, state) == (active and alg.match(event, state))


@PROPS
@given(algorithms(), st.integers(1, 7), st.integers(0, 7), st.integers(0, 50))
def test_every_n_steps_law(alg, n, offset, step):
    state = sbfunc.Context(sbfunc.random.key(0), time=Time(step=step))
    gated = every_n_steps(alg, n, offset)
    active = step >= offset and (step - offset) % n == 0
    assert gated.match(Event.BATCH_END, state) == (active and alg.match(Event.BATCH_END, state))


@PROPS
@given(algorithms(), events(), states(with_batch=False))
def test_when_law(alg, event, state):
    gated = when(alg, lambda s: s.time.step % 2 == 0)
    expected = state.time.step % 2 == 0 and alg.match(event, state)
    assert gated.match(event, state) == expected


def test_gated_parts_apply_as_the_part(view0):
    toy = Toy(tag=4, exit_code=1)
    gated = every_n_steps(during(toy, 0, 1), 2)
    out, code = apply_if_matched(gated, Event.INIT, view0.replace(own=gated.init(view0.key)))
    assert (out.own, code) == ((4,), 1)


def test_gates_validate_and_keep_names_in_chains():
    toy = Toy()
    for bad in (dict(start=-0.1, end=0.5), dict(start=0.5, end=1.5), dict(start=0.6, end=0.5)):
        with pytest.raises(ValueError):
            during(toy, **bad)
    with pytest.raises(ValueError, match="n must"):
        every_n_steps(toy, 0)
    with pytest.raises(ValueError, match="offset"):
        every_n_steps(toy, 1, offset=-1)
    with pytest.raises(TypeError, match="predicate"):
        when(toy, 3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Events"):
        on_events(toy, ["init"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="Algorithm"):
        during(object(), 0, 1)  # type: ignore[arg-type]
    combined = sequence(during(toy, 0, 1), during(toy, 0, 1))
    assert [p.name for p in combined.parts] == ["Toy", "Toy"] and toy.name == "Toy"
    assert combined.init(sbfunc.random.key(0)) == ((), ())
    assert "during" in repr(combined)


def test_flags_are_set_when_built_and_bind_builds_anew_without_changing_anything():
    # An unbound Selective Backprop: for_step returns a new one, so every combinator above it does.
    sb = sbfunc.SelectiveBackprop(0.0, 1.0, interrupt=0)
    gated = on_events(during(sb, 0.25, 1.0), [Event.AFTER_DATALOADER, Event.INIT])
    assert gated.events == frozenset({Event.AFTER_DATALOADER})  # narrowed to the part's
    assert gated.uses_elapsed and gated.selects_samples
    renamed = sequence(gated, Toy(), name="pair").renamed("renamed")
    model = torch.nn.Linear(4, 3)
    loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy)
    bound = renamed.for_step(loss_fn=loss_fn, per_sample=None)
    assert bound is not renamed and bound.name == "renamed"
    inner = bound.parts[0]
    assert (inner.events, inner.uses_elapsed, inner.name) == (
        gated.events,
        True,
        "SelectiveBackprop",
    )
    assert inner.part.part.loss_fn is not None and sb.loss_fn is None  # sb itself unchanged
    assert gated.parts[0].parts[0] is sb
    unbound_toys = sequence(Toy(), on_events(Toy(), [Event.INIT]))
    assert (
        unbound_toys.for_step(loss_fn=loss_fn, per_sample=None) is unbound_toys
    )  # nothing to bind
    with pytest.raises(AttributeError, match="frozen"):
        gated.events = None
