"""mean_across_ranks: a world of one passes the updates unchanged; with more ranks the bucketed
all-reduce sum is divided by the world size, key by key (a stand-in Comm plays the ranks: the
two-process harness covers Comm itself)."""

import pytest
import torch

import sbfunc
from sbfunc import optim
from sbfunc.distributed import Comm
from sbfunc.distributed._mean import _MeanAcrossRanks, mean_across_ranks
from tests.helpers import assert_identical


def test_a_world_of_one_passes_the_updates_unchanged():
    opt = mean_across_ranks()
    updates = {"a": torch.randn(3), "b": torch.randn(2, 2, dtype=torch.float64)}
    out, state = opt.update(updates, opt.init(updates))
    assert_identical(out, updates)
    assert state == sbfunc.types.EmptyState()
    assert "mean_across_ranks" in repr(opt)


class _Ranks(Comm):
    """``world`` ranks that all hold the caller's tensors plus ``rank`` (no process group)."""

    def __init__(self, world):
        super().__init__()
        self.world = world
        self.buckets = []

    def all_reduce_sum(self, tensors, *, scale=1, bucket_bytes, purpose):
        self.buckets.append(bucket_bytes)
        return [sum(t * scale + r for r in range(self.world)) for t in tensors]


@pytest.mark.parametrize("world", [2, 3])
def test_more_ranks_average_the_updates_key_by_key(world):
    comm = _Ranks(world)
    opt = _MeanAcrossRanks(name="mean_across_ranks", comm=comm, bucket_bytes=64).transformation()
    chain = optim.chain(opt, optim.sgd(1.0))
    updates = {"b": torch.ones(2), "a": torch.zeros(3, dtype=torch.float64)}
    out, _ = chain.update(updates, chain.init(updates))
    shift = sum(range(world)) / world  # the mean of the ranks' offsets
    assert list(out) == ["b", "a"] and comm.buckets == [64]
    torch.testing.assert_close(out["b"], -(torch.ones(2) + shift))
    torch.testing.assert_close(out["a"], -torch.full((3,), shift, dtype=torch.float64))


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="bucket_bytes"):
        mean_across_ranks(bucket_bytes=0)
    with pytest.raises(ValueError, match="not initialised"):
        mean_across_ranks(object())
