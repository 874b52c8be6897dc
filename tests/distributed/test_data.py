import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc.distributed import Comm, shard_ids, sharded_batches

KEY = sbfunc.random.key(3)


@settings(max_examples=40, derandomize=True, database=None, deadline=None)
@given(
    n=st.integers(1, 60), batch=st.integers(1, 9), world=st.integers(1, 4), epoch=st.integers(0, 3)
)
def test_shards_partition_the_epoch_and_concatenate_to_the_global_batches(n, batch, world, epoch):
    per_rank = [
        shard_ids(n, batch, key=KEY, epoch=epoch, rank=r, world=world) for r in range(world)
    ]
    steps = {len(s) for s in per_rank}
    assert steps == {-(-n // (batch * world))}  # every rank runs the same number of steps
    everything = torch.cat([ids for s in per_rank for ids in s])
    assert sorted(everything.tolist()) == list(range(n))  # no overlap, nothing dropped
    (single,) = [shard_ids(n, batch * world, key=KEY, epoch=epoch, rank=0, world=1)]
    for i, global_ids in enumerate(single):
        assert torch.equal(torch.cat([s[i] for s in per_rank]), global_ids)
        sizes = [s[i].shape[0] for s in per_rank]
        assert max(sizes) - min(sizes) <= 1


def test_epochs_reshuffle():
    a = torch.cat(shard_ids(40, 5, key=KEY, epoch=0, rank=0, world=2))
    b = torch.cat(shard_ids(40, 5, key=KEY, epoch=1, rank=0, world=2))
    assert not torch.equal(a, b)


def test_sharded_batches_index_lazily_and_have_a_length():
    x, y = torch.arange(20.0).reshape(10, 2), torch.arange(10)
    epoch = sharded_batches([x, y], 4, key=KEY, epoch=0, comm=Comm())
    assert len(epoch) == 3
    for bx, by, ids in epoch:
        assert torch.equal(bx, x[ids]) and torch.equal(by, y[ids])
    assert [b[2].tolist() for b in epoch[1:]] == [epoch[1][2].tolist(), epoch[2][2].tolist()]


def test_arguments_are_checked():
    with pytest.raises(ValueError, match=r"rank must be an int in \[0, 1\], got 2"):
        shard_ids(10, 2, key=KEY, epoch=0, rank=2, world=2)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
        shard_ids(10, 0, key=KEY, epoch=0, rank=0, world=1)
    with pytest.raises(ValueError, match="sharing their first axis"):
        sharded_batches([torch.zeros(2), torch.zeros(3)], 1, key=KEY, epoch=0)
