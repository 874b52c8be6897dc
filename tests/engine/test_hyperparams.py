"""inject_hyperparams: schedules of elapsed time, values editable in state."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc.engine import Event, Time, init_state, inject_hyperparams
from sbfunc.testing import LOG, Toy

PROPS = settings(max_examples=40, derandomize=True, deadline=None, database=None)


@PROPS
@given(st.floats(0, 1), st.integers(0, 9))
def test_schedules_follow_elapsed_and_constants_are_editable(elapsed, edited):
    alg = inject_hyperparams(Toy)(tag=lambda t: t * 2, exit_code=None, name="toy")
    state = init_state({}, {}, key=sbfunc.random.key(0), algorithms=[alg])
    assert state.algorithm_state[alg.name] == {"tag": 0.0, "exit_code": None, "name": "toy"}
    state = state.replace(time=Time(elapsed=elapsed))
    out = alg.apply(Event.INIT, state)
    assert out.algorithm_state[LOG] == (elapsed * 2,)
    assert out.algorithm_state["hyperparams:toy"]["tag"] == elapsed * 2
    edited_state = state.replace(
        algorithm_state={alg.name: {"tag": 0.0, "exit_code": edited, "name": "toy"}}
    )
    _, code = alg.apply(Event.INIT, edited_state)
    assert code == edited


def test_flags_and_parts_come_from_the_built_algorithm():
    alg = inject_hyperparams(Toy, name="hp")(selects_samples=True, name="inner")
    assert alg.selects_samples and alg.name == "hp" and alg.parts[0].name == "inner"


def test_validation():
    with pytest.raises(TypeError, match="factory"):
        inject_hyperparams(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Algorithm"):
        inject_hyperparams(lambda **kw: object())()
