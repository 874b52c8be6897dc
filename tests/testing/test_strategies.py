"""sbfunc.testing strategies draw valid, varied values."""

from hypothesis import given, settings

import sbfunc
from sbfunc.engine import FLAGS, Algorithm, Event, State
from sbfunc.testing import algorithm_lists, algorithms, events, pytree_batches, states

PROPS = settings(max_examples=30, derandomize=True, deadline=None, database=None)


@PROPS
@given(events(), algorithms(), algorithm_lists(), pytree_batches(), states())
def test_strategies_draw_valid_values(event, alg, algs, batch, state):
    assert isinstance(event, Event) and isinstance(alg, Algorithm)
    assert all(isinstance(getattr(alg, f), bool) for f in FLAGS)
    assert [a.tag for a in algs] == list(range(len(algs)))
    assert sbfunc.batch_size(batch) >= 1
    assert isinstance(state, State) and sbfunc.random.is_key(state.key)
    assert 0.0 <= state.time.elapsed <= 1.0
