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


def test_a_schedule_needs_the_run_s_length_in_a_step():
    """A scheduled value reads time.elapsed, which stays 0 without the run's length: the step
    refuses, as for every algorithm that decides from elapsed; constants need no length."""
    import torch

    model = torch.nn.Linear(2, 2)
    loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy)
    scheduled = schedule_hyperparams(sbfunc.algorithms.LabelSmoothing)(
        smoothing=lambda t: 0.1 * t, num_classes=2
    )
    constant = schedule_hyperparams(sbfunc.algorithms.LabelSmoothing)(smoothing=0.1, num_classes=2)
    assert scheduled.uses_elapsed and not constant.uses_elapsed
    batch = (torch.randn(4, 2), torch.tensor([0, 1, 1, 0]))
    params, buffers = sbfunc.split_module(model)
    for alg, total_steps in ((constant, None), (scheduled, 3)):
        step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1), [alg])
        state = step.init(params, buffers, key=sbfunc.random.key(0), total_steps=total_steps)
        step(state, batch)
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1), [scheduled])
    state = step.init(params, buffers, key=sbfunc.random.key(0))
    with pytest.raises(ValueError, match=r"time\.elapsed .*total_steps=N"):
        step(state, batch)
