"""The packed step-start time (``Clock``) unpacks into exactly what ``Time.as_tensors`` makes."""

import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import sbfunc
from sbfunc.engine.internal import Clock

counts = st.integers(min_value=0, max_value=2**62)


def _same(a: sbfunc.Time, b: sbfunc.Time) -> None:
    for name, x, y in zip(a._fields, a, b, strict=True):
        if x is None or y is None:
            assert x is None and y is None, name
            continue
        assert x.dtype == y.dtype and x.shape == y.shape == (), name
        assert torch.equal(x, y) or (x.isnan() and y.isnan()), name


@given(
    step=counts,
    epoch=counts,
    batch_in_epoch=counts,
    forwarded=counts,
    backpropagated=counts,
    elapsed=st.floats(allow_nan=False, width=64) | st.integers(0, 1),
    total=st.none() | st.integers(min_value=1, max_value=2**62),
    counters=st.booleans(),
)
def test_a_clock_unpacks_to_the_tensors_of_as_tensors(
    step, epoch, batch_in_epoch, forwarded, backpropagated, elapsed, total, counters
):
    zero = torch.zeros((), dtype=torch.int64)
    time = sbfunc.Time(
        step, epoch, batch_in_epoch, elapsed, forwarded, backpropagated,
        updates_skipped=zero + 3 if counters else None, total_steps=total,
        rows_nonfinite=zero + 5 if counters else None,
    )  # fmt: skip
    clock = Clock.of(time, "cpu")
    assert clock.values.dtype == torch.int64 and clock.values.shape == (7,)
    _same(clock.time(time), time.as_tensors("cpu"))


def test_a_step_plan_carries_one_tensor_of_time():
    ce = torch.nn.functional.cross_entropy
    model = torch.nn.Linear(2, 2)
    sb = sbfunc.SelectiveBackprop(start=0.0, end=1.0, keep=0.5, interrupt=0)
    step = sbfunc.make_train_step(sbfunc.per_sample_loss(model, ce), sbfunc.optim.sgd(0.1), [sb])
    state = step.init(*sbfunc.split_module(model), key=sbfunc.random.key(0))
    plan = step.plan(state, (torch.randn(4, 2), torch.tensor([0, 1, 1, 0])))
    assert isinstance(plan.clock, Clock) and plan.clock.total_known is False
    plain = sbfunc.make_train_step(sbfunc.per_sample_loss(model, ce), sbfunc.optim.sgd(0.1))
    assert plain.plan(state._replace(algorithm_state=()), (torch.randn(4, 2),)).clock is None


class _CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_finish_runs_no_tensor_operation():
    """Every count of a step is made inside the core: ``finish`` is host bookkeeping only (on
    an accelerator, no kernel outside the compiled graph)."""
    ce = torch.nn.functional.cross_entropy
    model = torch.nn.Linear(2, 2)
    loss_fn = sbfunc.per_sample_loss(model, ce)
    sb = sbfunc.SelectiveBackprop(start=0.0, end=1.0, keep=0.5, interrupt=0)
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.adam(0.1), [sb])
    state = step.init(*sbfunc.split_module(model), key=sbfunc.random.key(0))
    x = torch.tensor([[0.0, 1.0], [float("nan"), 0.0], [1.0, 1.0], [2.0, 0.0]])
    batch = (x, torch.tensor([0, 1, 1, 0]))
    plan = step.plan(state, batch)
    carry, out = step.core(plan, state, batch)
    with _CountOps() as counter:
        new, metrics = step.finish(state, carry, out)
    assert counter.ops == []
    assert new.time.rows_nonfinite is out.rows_nonfinite_total
    assert metrics.rows_nonfinite is out.rows_nonfinite
