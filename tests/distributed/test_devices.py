"""The data-parallel step on the ``meta`` device (tensors without data: a host read or a
device mix raises there). ``meta`` has no process-group backend, so the world > 1 code paths
run on :class:`_MirrorComm`: rank 0 of two whose peer holds the same tensors, its collectives
answered in place by a stand-in for ``torch.distributed`` (``sbfunc.distributed._comm.dist``,
patched for the test). The step, its all-reduce and the buffer sync read nothing; a selection
wrapper that communicates reads the row counts, at the places docs/how-to/compile.md lists."""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sbfunc
from sbfunc import distributed as sbdist
from sbfunc import random as sbrandom
from sbfunc.distributed import _comm as comm_module
from sbfunc.distributed._scope import _Scope
from tests.helpers import split
from tests.meta import META, all_meta, empty, host_read, sbfunc_frames, sync_site, to_meta

N, NUM_IDS = 16, 64
P = sbfunc.policies
WRAPPERS = {  # a selection of the step's rows under data parallelism
    "local": lambda c: sbdist.local_selection(P.rank_power(0.5), comm=c),
    "local_stateful": lambda c: sbdist.local_selection(
        P.loshchilov(10.0, 0.5, num_ids=NUM_IDS), comm=c
    ),
    "local_rebalance": lambda c: sbdist.local_selection(P.top_k(0.5), rebalance=True, comm=c),
    "global": lambda c: sbdist.global_selection(P.rank_power(0.5), comm=c),
    "global_rebalance": lambda c: sbdist.global_selection(
        P.loshchilov(10.0, 0.5, num_ids=NUM_IDS), rebalance=True, comm=c
    ),
}
COMMUNICATE = {"local_stateful", "local_rebalance", "global", "global_rebalance"}
COUNTS_AT = ("distributed/_scope.py", "_counts")  # every rank's row count, before the gather
BOUNDS_AT = ("distributed/_scope.py", "choose")  # where each rank's kept rows start (global)


class _Done:
    def wait(self) -> None:
        pass


def _gather(out, wire, group=None):
    out.copy_(torch.cat([wire, wire]))


_MIRROR = types.SimpleNamespace(  # the collectives comm.py calls, for two equal ranks
    is_available=lambda: True,
    is_initialized=lambda: False,
    all_reduce=lambda f, group=None, async_op=False: (f.mul_(2), _Done())[1],
    broadcast=lambda f, group=None, group_src=0: None,
    all_gather_single=_gather,
    all_to_all_single=lambda out, wire, receive, send, group=None: out.zero_(),
)


class _MirrorComm(sbdist.Comm):
    """Rank 0 of two equal ranks (with ``sbfunc.distributed._comm.dist`` patched)."""

    def __init__(self) -> None:
        super().__init__(meter=sbdist.TrafficMeter())
        self.world = 2


@pytest.fixture
def comms(monkeypatch):
    """``"one"``: a world of one (no collective runs); ``"two"``: a :class:`_MirrorComm`."""
    monkeypatch.setattr(comm_module, "dist", _MIRROR)
    return {"one": sbdist.Comm, "two": _MirrorComm}


def _run(comm, wrapper=None, *, buffers="broadcast", microbatch_size=None, nonfinite="skip"):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    sb = sbfunc.SelectiveBackprop(
        0.0,
        1.0,
        interrupt=0,
        policy=WRAPPERS[wrapper](comm) if wrapper else None,
        ids=2,
        scoring=sbfunc.score.Scoring(reuse_losses=False),
    )
    step = sbdist.make_data_parallel_step(
        sbfunc.per_sample_loss(model, F.cross_entropy, mode="train"),
        sbfunc.optim.adam(1e-3),
        [sb] if wrapper else [],
        comm=comm,
        buffers=buffers,
        microbatching=split(size=microbatch_size),
        nonfinite=nonfinite,
    )
    params, state_buffers = to_meta(sbfunc.split_module(model, clone=True))
    state = step.init(params, state_buffers, key=sbrandom.key(0).to(META), total_steps=4)
    batch = (empty(N, 4), empty(N, dtype=torch.int64), empty(N, dtype=torch.int64))
    for _ in range(2):
        state, metrics = step(state, batch)
    return state, metrics


@pytest.mark.parametrize("microbatch_size", [None, 4])
@pytest.mark.parametrize("buffers", ["broadcast", "mean"])
@pytest.mark.parametrize("world", ["one", "two"])
@pytest.mark.parametrize("wrapper", [None, "local"])
def test_the_data_parallel_step_never_reads_the_device(
    comms, world, wrapper, buffers, microbatch_size
):
    comm = comms[world]()
    state, metrics = _run(comm, wrapper, buffers=buffers, microbatch_size=microbatch_size)
    assert metrics.samples_backpropagated == (N if wrapper is None else N // 2)
    assert all_meta(state)
    if comm.meter is not None:  # two ranks: the collectives ran
        assert {"init", "gradients", "buffers"} <= comm.meter.totals().keys()


@pytest.mark.parametrize("wrapper", sorted(COMMUNICATE))
def test_selection_wrappers_of_one_process_read_nothing(comms, wrapper):
    state, metrics = _run(comms["one"](), wrapper)
    assert 0 < metrics.samples_backpropagated < N
    assert all_meta(state)


@pytest.mark.parametrize("wrapper", sorted(COMMUNICATE))
def test_communicating_wrappers_read_the_row_counts_first(comms, wrapper):
    with host_read() as error:
        _run(comms["two"](), wrapper)
    assert sync_site(error.value) == COUNTS_AT


@pytest.mark.parametrize("wrapper", sorted(COMMUNICATE))
def test_with_the_counts_known_only_a_global_selection_reads_again(comms, monkeypatch, wrapper):
    """The counts answered on the host: a local selection reads nothing more, a global one
    reads where this rank's kept rows start."""
    monkeypatch.setattr(_Scope, "_counts", lambda self, n, device: [n] * self.comm.world)
    if wrapper.startswith("local"):
        assert all_meta(_run(comms["two"](), wrapper)[0])
        return
    with host_read() as error:
        _run(comms["two"](), wrapper)
    assert sync_site(error.value) == BOUNDS_AT


@pytest.mark.parametrize("world", ["one", "two"])
def test_nonfinite_raise_reads_only_in_the_guard(comms, world):
    with host_read() as error:
        _run(comms[world](), "local", nonfinite="raise")
    assert sync_site(error.value) == ("step/_train_step.py", "_raise_if_nonfinite")
    assert ("step/_train_step.py", "finish") in sbfunc_frames(error.value)
