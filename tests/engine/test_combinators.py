"""Combinator laws: chain identity and associativity, gates, flags, names."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc.engine import (
    FLAGS,
    Event,
    Time,
    chain,
    during,
    every_n_steps,
    init_state,
    named_chain,
    on_events,
    run_event,
    when,
)
from sbfunc.testing import LOG, Toy, algorithm_lists, algorithms, events, states

STATE0 = init_state({}, {}, key=sbfunc.random.key(0))
PROPS = settings(max_examples=50, derandomize=True, deadline=None, database=None)


def log_of(alg, event, state):
    if not alg.match(event, state):
        return None
    out = alg.apply(event, state)
    out = out[0] if isinstance(out, tuple) and not hasattr(out, "params") else out
    return out.algorithm_state.get(LOG, ())


@PROPS
@given(events(), states(with_batch=False))
def test_empty_chain_is_identity(event, state):
    empty = chain()
    assert not empty.match(event, state)
    assert empty.apply(event, state) is state
    assert all(getattr(empty, f) is False for f in FLAGS)


@PROPS
@given(algorithm_lists(max_size=6), events(), states(with_batch=False), st.data())
def test_chain_is_associative_in_effect(algs, event, state, data):
    i = data.draw(st.integers(0, len(algs)))
    j = data.draw(st.integers(i, len(algs)))
    a, b, c = algs[:i], algs[i:j], algs[j:]
    left = chain(chain(*a), chain(*b), chain(*c))
    flat = chain(*algs)
    right = chain(*a, chain(*b, *c))
    assert log_of(left, event, state) == log_of(flat, event, state) == log_of(right, event, state)
    for f in FLAGS:
        assert getattr(flat, f) == any(getattr(x, f) for x in algs)


@PROPS
@given(algorithm_lists(max_size=5))
def test_chain_renames_collisions_on_copies(algs):
    before = [a.name for a in algs]
    combined = chain(*algs)
    names = [p.name for p in combined.parts]
    assert len(set(names)) == len(names)
    assert [a.name for a in algs] == before  # inputs untouched
    assert [p.tag for p in combined.parts] == [a.tag for a in algs]


def test_chain_reports_the_last_exit_code(state0):
    combined = chain(Toy(tag=0, exit_code=1), Toy(tag=1), Toy(tag=2, exit_code=2))
    state, code = combined.apply(Event.INIT, state0)
    assert code == 2 and state.algorithm_state[LOG] == (0, 1, 2)


def test_named_chain():
    combined = named_chain(("x", Toy()), y=Toy(name="keep"))
    assert [p.name for p in combined.parts] == ["x", "y"]
    with pytest.raises(ValueError, match="unique"):
        named_chain(("x", Toy()), x=Toy())
    with pytest.raises(TypeError, match="pairs"):
        named_chain(Toy())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Algorithm"):
        chain(Toy(), object())  # type: ignore[arg-type]


@PROPS
@given(algorithms(), events(), states(with_batch=False), st.frozensets(events(), max_size=5))
def test_on_events_law(alg, event, state, allowed):
    gated = on_events(alg, allowed)
    assert gated.match(event, state) == (event in allowed and alg.match(event, state))
    assert gated.name == alg.name
    assert all(getattr(gated, f) == getattr(alg, f) for f in FLAGS)


@PROPS
@given(algorithm_lists(), events(), states(with_batch=False), st.floats(0, 1))
def test_never_active_window_never_applies(algs, event, state, point):
    gated = [during(a, point, point) for a in algs]
    new, traces = run_event(event, state, gated, passes=())
    assert traces == () and new is state


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
    state = STATE0.replace(time=Time(step=step))
    gated = every_n_steps(alg, n, offset)
    active = step >= offset and (step - offset) % n == 0
    assert gated.match(Event.BATCH_END, state) == (active and alg.match(Event.BATCH_END, state))


@PROPS
@given(algorithms(), events(), states(with_batch=False))
def test_when_law(alg, event, state):
    gated = when(alg, lambda s: s.time.step % 2 == 0)
    expected = state.time.step % 2 == 0 and alg.match(event, state)
    assert gated.match(event, state) == expected


def test_gates_validate_and_can_be_renamed_in_chains():
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
    combined = chain(during(toy, 0, 1), during(toy, 0, 1))
    assert [p.name for p in combined.parts] == ["Toy", "Toy#1"] and toy.name == "Toy"
    assert "during" in repr(combined)
