"""sbfunc.testing strategies draw valid, varied values; Toy and applied behave as documented."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc.engine import FLAGS, Algorithm, Context, Event, TrainState, run_event
from sbfunc.testing import (
    CLASSES,
    FEATURES,
    Toy,
    algorithm_lists,
    algorithms,
    applied,
    events,
    linear_loss,
    pytree_batches,
    states,
    train_states,
)

PROPS = settings(max_examples=30, derandomize=True, deadline=None, database=None)


@PROPS
@given(events(), algorithms(), algorithm_lists(), pytree_batches(), states())
def test_strategies_draw_valid_values(event, alg, algs, batch, state):
    assert isinstance(event, Event) and isinstance(alg, Algorithm)
    assert all(isinstance(getattr(alg, f), bool) for f in FLAGS)
    assert [a.tag for a in algs] == list(range(len(algs)))
    assert sbfunc.batch.batch_size(batch) >= 1
    assert isinstance(state, Context) and sbfunc.random.is_key(state.key)
    assert 0.0 <= state.time.elapsed <= 1.0
    assert state.own == () and state.scratch is None and state.matched is True


@PROPS
@given(states())
def test_drawn_params_and_batches_fit_the_linear_loss(state):
    n = sbfunc.batch.batch_size(state.batch)
    losses = linear_loss(state.params, state.buffers, state.batch)
    assert losses.shape == (n,) and bool((losses >= 0).all())
    assert state.params["weight"].shape[0] == state.params["bias"].shape[0] == CLASSES


@PROPS
@given(train_states(num_algorithms=3))
def test_train_states_have_one_empty_entry_per_algorithm(state):
    assert isinstance(state, TrainState) and state.algorithm_state == ((), (), ())
    assert state.time.updates_skipped is not None and sbfunc.random.is_key(state.key)


@PROPS
@given(train_states(), pytree_batches())
def test_train_states_and_pytree_batches_fit_together_by_default(state, batch):
    assert state.params["weight"].shape == (CLASSES, FEATURES)
    step = sbfunc.make_train_step(linear_loss, sbfunc.optim.sgd(0.1))
    start = step.init(state.params, state.buffers, key=state.key)
    new, metrics = step(start, batch)
    n = sbfunc.batch.batch_size(batch)
    assert new.time.step == 1 and metrics.samples_backpropagated == n
    assert not torch.equal(new.params["weight"], state.params["weight"])  # it trained
    assert torch.equal(state.params["weight"], start.params["weight"])  # purely


@PROPS
@given(train_states(features=None), st.data())
def test_drawn_feature_counts_still_fit_when_passed_on(state, data):
    d = state.params["weight"].shape[1]
    batch = data.draw(pytree_batches(features=d))
    assert linear_loss(state.params, state.buffers, batch).shape == (
        sbfunc.batch.batch_size(batch),
    )


@pytest.mark.parametrize(
    ("strategy", "msg"),
    [
        (lambda: pytree_batches(features=0), "features must be an int >= 1"),
        (lambda: pytree_batches(max_size=0), "max_size must be an int >= 1"),
        (lambda: train_states(num_algorithms=-1), "num_algorithms must be an int >= 0"),
        (lambda: states(features=2.0), "features must be an int >= 1"),
    ],
)
def test_strategy_arguments_are_validated(strategy, msg):
    @settings(max_examples=1, derandomize=True, database=None)
    @given(strategy())
    def draw(value):
        pass  # pragma: no cover - the draw raises

    with pytest.raises((ValueError, TypeError), match=msg):
        draw()


@PROPS
@given(algorithm_lists(max_size=6), events())
def test_applied_reads_positions_from_traces(algs, event):
    state = TrainState({}, {}, sbfunc.random.key(0), algorithm_state=((),) * len(algs))
    new, traces = run_event(event, state, algs, passes=())  # no passes: list order
    order = applied(traces, algs)
    assert order == [i for i, a in enumerate(algs) if a.match(event, None)]
    assert all(new.algorithm_state[i] == (algs[i].tag,) for i in order)


def test_toy_validates_its_events():
    with pytest.raises(TypeError, match="events"):
        Toy(events=["init"])
    assert repr(Toy(tag=1, name="x", selects_samples=True)) == (
        "Toy(tag=1, name='x', selects_samples)"
    )
