"""The non-finite guard of a compiled step (``fullgraph=True``): the graph selects the state
before a non-finite update (``torch.where``, fused into the update's kernels), so a
non-finite update never reaches the parameters, the optimizer state or the buffers, an
algorithm that reads the state after the update sees the kept one, the update is counted, a
loss scale keeps its backed-off scale, and nothing recompiles."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import sbfunc
from sbfunc import optim
from sbfunc import random as sbrandom
from sbfunc.engine import Algorithm, Event

torch.manual_seed(0)
MODEL = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
PARAMS, BUFFERS = sbfunc.split_module(MODEL, clone=True)
LOSS = sbfunc.per_sample_loss(MODEL, F.cross_entropy, mode="train")


class ParamsAtBatchEnd(Algorithm):
    """Reads the parameters after the update (``BATCH_END``), as weight averaging does."""

    events = frozenset({Event.BATCH_END})
    uses_key = False

    def init(self, key):
        return torch.zeros(())

    def apply(self, event, ctx):
        return ctx.replace(own=sum(p.sum() for p in ctx.params.values()))


def _loss_fn(params, buffers, batch):
    x, y, gain = batch
    return LOSS(params, buffers, (x, y)) * gain  # gain 1e38: every row finite, the mean not


def _batch(seed, gain=1.0):
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(seed))
    return x, (x[:, 0] > 0).long(), torch.full((8,), gain)


def _compiled(opt, algorithms=()):
    step = sbfunc.make_train_step(_loss_fn, opt, list(algorithms))
    step.compile(backend="aot_eager", fullgraph=True)
    return step, step.init(PARAMS, BUFFERS, key=sbrandom.key(0), total_steps=8)


def _equal(a, b) -> bool:
    leaves = torch.utils._pytree.tree_leaves
    return all(torch.equal(x, y) for x, y in zip(leaves(a), leaves(b), strict=True))


def _run_with_an_overflow(step, state):
    torch._dynamo.utils.counters.clear()
    good, _ = step(state, _batch(0))
    after, metrics = step(good, _batch(1, gain=1e38))
    final, last = step(after, _batch(2))
    assert bool(metrics.skipped) and not bool(last.skipped)
    assert int(final.time.updates_skipped) == 1 and int(after.time.updates_skipped) == 1
    assert all(torch.isfinite(p).all() for p in final.params.values())
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1  # no recompile
    return good, after, final


def test_a_compiled_step_keeps_a_non_finite_update_from_the_state():
    step, state = _compiled(optim.adam(1e-2))
    good, after, final = _run_with_an_overflow(step, state)
    assert _equal((good.params, good.opt_state, good.buffers),
                  (after.params, after.opt_state, after.buffers))  # fmt: skip
    assert not _equal(after.params, final.params)  # the next finite update applies


def test_a_compiled_loss_scale_backs_off_and_keeps_its_scale():
    step, state = _compiled(optim.dynamic_loss_scale(optim.adam(1e-2), init_scale=2.0**16))
    good, after, _ = _run_with_an_overflow(step, state)
    assert _equal((good.params, good.opt_state.inner), (after.params, after.opt_state.inner))
    assert float(after.opt_state.scale) == float(good.opt_state.scale) / 2


def test_a_reader_after_the_update_sees_the_kept_state():
    step, state = _compiled(optim.adam(1e-2), [ParamsAtBatchEnd()])
    good, after, _ = _run_with_an_overflow(step, state)
    assert _equal((good.params, good.opt_state), (after.params, after.opt_state))
    seen = after.algorithm_state[0]
    assert torch.equal(seen, sum(p.sum() for p in good.params.values()))
