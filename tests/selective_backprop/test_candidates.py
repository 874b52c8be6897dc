"""The equal-backprop-batch protocol (issue 37, item 4): loading candidate_batch_size(B, keep)
rows, a fixed-count selection backpropagates exactly B rows every step."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc.select import kept_count
from sbfunc.selective_backprop import SelectiveBackprop, candidate_batch_size


@settings(max_examples=200, deadline=None)
@given(b=st.integers(1, 512), keep=st.floats(0.01, 1.0))
def test_the_candidates_keep_exactly_the_backprop_batch(b, keep):
    n = candidate_batch_size(b, keep)
    assert kept_count(n, keep) == b
    assert abs(n - b / keep) <= 1  # about b / keep: keep is the fraction the step trains on


@pytest.mark.parametrize("keep", [0.1, 0.3, 0.5])
def test_selective_backprop_backpropagates_the_plain_batch_size(keep):
    b = 16
    n = candidate_batch_size(b, keep)
    model = torch.nn.Linear(5, 3)
    loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy)
    sb = SelectiveBackprop(start=0.0, end=1.0, interrupt=0, keep=keep)
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1), [sb])
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))
    x, y = torch.randn(10 * n, 5), torch.randint(0, 3, (10 * n,))
    for batch in sbfunc.datasets.batches(x, y, n, key=sbfunc.random.key(1)):
        state, metrics = step(state, batch)
        assert (metrics.samples_in_batch, metrics.samples_backpropagated) == (n, b)


def test_the_arguments_are_checked():
    with pytest.raises(ValueError, match="backprop_batch must be an int >= 1"):
        candidate_batch_size(0, 0.5)
    with pytest.raises(ValueError, match="keep"):
        candidate_batch_size(8, 0.0)
