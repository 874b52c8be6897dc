import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import sbfunc
from sbfunc.algorithms import GhostBatchNorm, GhostBatchNorm2d

common = settings(max_examples=25, deadline=None, derandomize=True, database=None)


def _bn(kind=nn.BatchNorm1d, c=3, momentum=0.1):
    torch.manual_seed(0)
    bn = kind(c, momentum=momentum)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 2.0)
        bn.bias.uniform_(-1.0, 1.0)
    return bn


@common
@given(st.integers(2, 14), st.integers(2, 6), st.integers(0, 2**31 - 1))
def test_each_ghost_batch_is_normalised_on_its_own(n, size, seed):
    bn = _bn()
    ghost = GhostBatchNorm(size)(bn)
    x = torch.randn(n, 3, generator=torch.Generator().manual_seed(seed)) * 3 + 1
    out = ghost(x)
    parts = x.tensor_split(max(1, n // size))
    assert all(p.shape[0] >= min(size, n) for p in parts)
    expected = torch.cat([F.batch_norm(p, None, None, bn.weight, bn.bias, True) for p in parts])
    assert out.shape == x.shape
    torch.testing.assert_close(out, expected)
    # running statistics: one update per chunk, with the momentum split between them
    mean, var = torch.zeros(3), torch.ones(3)
    m = 0.1 / len(parts)
    for p in parts:
        mean, var = (1 - m) * mean + m * p.mean(0), (1 - m) * var + m * p.var(0)
    torch.testing.assert_close(ghost.running_mean, mean)
    torch.testing.assert_close(ghost.running_var, var)
    assert int(ghost.num_batches_tracked) == len(parts)


@common
@given(st.integers(2, 10), st.integers(0, 3), st.integers(0, 2**31 - 1))
def test_one_ghost_batch_is_plain_batchnorm(n, extra, seed):
    """Zero strength: a ghost batch as large as the batch changes nothing (train and eval)."""
    bn = _bn(nn.BatchNorm2d)
    ghost = GhostBatchNorm(n + extra)(bn)
    x = torch.randn(n, 3, 2, 2, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(ghost(x), bn(x))
    assert all(torch.equal(a, b) for a, b in zip(ghost.buffers(), bn.buffers(), strict=True))
    ghost.eval(), bn.eval()
    assert torch.equal(ghost(x), bn(x))


def test_surgery_keeps_names_and_never_changes_its_input():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 2, 1), nn.BatchNorm2d(2), nn.Sequential(nn.BatchNorm1d(2)))
    ghost = GhostBatchNorm(ghost_batch_size=4)(net)
    assert type(net[1]) is nn.BatchNorm2d and type(ghost[1]) is GhostBatchNorm2d
    assert type(ghost[2][0]).__name__ == "GhostBatchNorm1d"
    p0, b0 = sbfunc.split_module(net)
    p1, b1 = sbfunc.split_module(ghost)
    assert p0.keys() == p1.keys() and b0.keys() == b1.keys()
    assert all(torch.equal(p0[k], p1[k]) for k in p0)


def test_momentum_none_is_a_cumulative_average_per_chunk():
    bn = _bn(momentum=None)
    ghost = GhostBatchNorm(2)(bn)
    x = torch.randn(5, 3)
    ghost(x)
    expected = (x[:3].mean(0) + x[3:].mean(0)) / 2
    torch.testing.assert_close(ghost.running_mean, expected)


def test_trains_in_a_step_and_with_fewer_kept_rows_than_a_ghost_batch():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    model = GhostBatchNorm(4)(net)
    train = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    score = sbfunc.per_sample_loss(model, F.cross_entropy)
    sb = sbfunc.SelectiveBackprop(
        0.0, 1.0, 0.25, interrupt=0, scoring=sbfunc.score.Scoring(loss_fn=score)
    )
    step = sbfunc.make_train_step(train, sbfunc.optim.sgd(0.1), [sb])
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))
    batch = (torch.randn(12, 4), torch.randint(0, 2, (12,)))
    state, metrics = step(state, batch)
    assert metrics.samples_backpropagated == 3  # one ghost batch of 3 < 4 rows (Composer: error)
    assert int(state.buffers["1.num_batches_tracked"]) == 1
    assert bool(torch.isfinite(metrics.loss))


@pytest.mark.parametrize(
    ("args", "exc", "msg"),
    [
        ((nn.BatchNorm1d(2), 0), ValueError, "ghost_batch_size must be an int >= 1"),
        ((nn.BatchNorm1d(2), 2.0), TypeError, "ghost_batch_size must be an int"),
        ((nn.Linear(2, 2), 2), ValueError, "no nn.BatchNorm1d"),
    ],
)
def test_errors(args, exc, msg):
    with pytest.raises(exc, match=msg):
        GhostBatchNorm(args[1])(args[0])
