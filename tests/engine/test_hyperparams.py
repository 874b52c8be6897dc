"""schedule_hyperparams: schedules of elapsed time, values editable in state."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc.engine import Event, Time, run_event, schedule_hyperparams
from sbfunc.testing import Toy
from tests.engine.helpers import for_algorithms

PROPS = settings(max_examples=40, derandomize=True, deadline=None, database=None)


@PROPS
@given(st.floats(0, 1), st.integers(0, 9))
def test_schedules_follow_elapsed_and_constants_are_editable(elapsed, edited):
    alg = schedule_hyperparams(Toy)(tag=lambda t: t * 2, exit_code=None, name="toy")
    key = sbfunc.random.key(0)
    own = alg.init(key)
    assert own == ({"tag": 0.0, "exit_code": None, "name": "toy"}, ())
    state = sbfunc.Context(key, own=own, time=Time(elapsed=elapsed))
    out = alg.apply(Event.INIT, state)
    values, log = out.own
    assert log == (elapsed * 2,) and values["tag"] == elapsed * 2
    edited_state = state.replace(own=({"tag": 0.0, "exit_code": edited, "name": "toy"}, ()))
    out, code = alg.apply(Event.INIT, edited_state)
    assert code == edited and out.own[0]["exit_code"] == edited


def test_state_persists_through_the_engine():
    alg = schedule_hyperparams(Toy)(tag=lambda t: round(10 * t))
    state = for_algorithms(sbfunc.TrainState({}, {}, sbfunc.random.key(0)), [alg])
    for elapsed in (0.2, 0.5):
        state = state.replace(time=Time(elapsed=elapsed))
        state, traces = run_event(Event.BATCH_END, state, [alg])
        assert [t.name for t in traces] == ["hyperparams:Toy"]
    assert state.algorithm_state == (({"tag": 5}, (2, 5)),)


def test_match_reads_the_current_values():
    alg = schedule_hyperparams(Toy)(events=lambda t: [Event.INIT] if t < 0.5 else [Event.FIT_END])
    key = sbfunc.random.key(0)
    early = sbfunc.Context(key, own=alg.init(key), time=Time(elapsed=0.1))
    late = early.replace(time=Time(elapsed=0.7))
    assert alg.match(Event.INIT, early) and not alg.match(Event.INIT, late)
    assert alg.match(Event.FIT_END, late)


def test_flags_and_parts_come_from_the_built_algorithm():
    alg = schedule_hyperparams(Toy, name="hp")(selects_samples=True, name="inner")
    assert alg.selects_samples and alg.name == "hp" and alg.parts[0].name == "inner"


def test_validation():
    with pytest.raises(TypeError, match="factory"):
        schedule_hyperparams(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Algorithm"):
        schedule_hyperparams(lambda **kw: object())()
