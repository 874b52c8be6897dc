"""``torch.compile(step)``: equal to eager, a fixed small number of graphs over a run.

Compiling costs 10-50 s per graph on a 2-core CPU, so the steps are built and compiled once per
module and every test shares them; the ``step.compile()`` test and the graph-count test of a
refilled queue compile with ``aot_eager`` (dynamo's and AOTAutograd's graphs without
inductor's code generation: the module's shared run is inductor's).
"""

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch import nn
from torch._dynamo.utils import counters

import sbfunc

STEPS = 16  # the SB window [0.25, 0.75) with interrupt=2 is crossed: off, on/off, off
N = 16


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv1d(1, 4, 3, padding=1, bias=False),  # no bias before BN: its gradient is 0
        nn.BatchNorm1d(4),
        nn.ReLU(),
        nn.Dropout(0.1),
        nn.Flatten(),
        nn.Linear(32, 3),
    )


def _batch(i: int):
    k = sbfunc.random.fold_in(sbfunc.random.key(123), i)
    x = sbfunc.random.normal(k, (N, 1, 8))
    y = (x[:, 0, :4].sum(1) > 0).long() + (x[:, 0, 0] > 0.5).long()
    return (x, y, torch.arange(N) + N * (i % 4))


def _build(policy=None, refill=False, others=True):
    model = _model()
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    if policy is None:
        sb = sbfunc.SelectiveBackprop(0.25, 0.75, keep=0.5, interrupt=2)
    else:
        sb = sbfunc.SelectiveBackprop(
            0.25, 0.75, interrupt=2, policy=policy, ids=2, refill=_batch(0) if refill else None
        )
    algorithms = [sb]
    if others:
        algorithms += [
            sbfunc.algorithms.CutOut(length=0.25),
            sbfunc.algorithms.MixUp(0.4, num_classes=3),
            sbfunc.algorithms.LabelSmoothing(0.1, num_classes=3),
        ]
    lr = sbfunc.optim.cosine_decay_schedule(1e-2, STEPS)
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.adam(lr), algorithms)
    state = step.init(
        *sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0), total_steps=64
    )
    return step, state


def _at(state, i):
    return state.replace(time=state.time._replace(elapsed=i / STEPS))


def _assert_close(a, b):
    for k in a.params:
        torch.testing.assert_close(a.params[k], b.params[k], rtol=1e-6, atol=1e-7)
    for k in a.buffers:
        torch.testing.assert_close(a.buffers[k], b.buffers[k], rtol=1e-6, atol=1e-7)


@pytest.fixture(scope="module")
def compiled_run():
    """A 16-step compiled run beside eager steps from the same states, with graph counts."""
    torch._dynamo.reset()
    counters.clear()
    step, state = _build()
    compiled = torch.compile(step)
    graphs, pairs = [], []
    for i in range(STEPS):
        state = _at(state, i)
        eager_next, eager_metrics = step(state, _batch(i))
        state, metrics = compiled(state, _batch(i))
        pairs.append((eager_next, state, eager_metrics, metrics))
        graphs.append(counters["stats"]["unique_graphs"])
    return step, state, graphs, pairs


def test_each_compiled_step_equals_the_eager_step(compiled_run):
    _, _, _, pairs = compiled_run
    for eager, comp, em, cm in pairs:
        _assert_close(eager, comp)
        assert eager.time == comp.time
        assert em.samples_backpropagated == cm.samples_backpropagated
        assert [t.name for t in em.traces] == [t.name for t in cm.traces]


def test_a_fixed_small_number_of_graphs_over_the_run(compiled_run):
    _, _, graphs, pairs = compiled_run
    # SB on and off (the interrupt alternation and the window) are the only two plans.
    assert {m.samples_backpropagated for *_, m in pairs} == {N // 2, N}
    assert graphs[-1] == 2, graphs  # one graph per plan
    assert graphs[STEPS // 2] == graphs[-1], graphs  # nothing new once both plans were seen


def test_the_compiled_step_keeps_init_and_fire(compiled_run):
    step, state, _, _ = compiled_run
    compiled = torch.compile(step)
    assert compiled.run_event(sbfunc.Event.EPOCH_END, state)[0].time == state.time
    assert compiled.init(state.params, state.buffers, key=sbfunc.random.key(1)).time.step == 0


def test_step_compile_is_one_fullgraph_frame_equal_to_eager():
    """``step.compile()``: the host plan and finish around the compiled core; with
    ``fullgraph=True`` no graph break, one graph per plan, no recompiles, the eager results."""
    torch._dynamo.reset()
    counters.clear()
    step, state = _build()
    eager_step, eager_state = _build()
    step.compile(fullgraph=True, backend="aot_eager")  # inductor: compiled_run above
    graphs = []
    for i in range(STEPS):
        state, eager_state = _at(state, i), _at(eager_state, i)
        state, metrics = step(state, _batch(i))
        eager_state, eager_metrics = eager_step(eager_state, _batch(i))
        _assert_close(eager_state, state)
        assert eager_state.time == state.time
        assert metrics.samples_backpropagated == eager_metrics.samples_backpropagated
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[-1] == 2, graphs  # SB on and off
    assert graphs[STEPS // 2] == graphs[-1], graphs
    assert sum(counters["graph_break"].values()) == 0
    assert sum(counters["recompiles"].values()) == 0


def test_variable_count_policy_with_refill_compiles_to_a_bounded_number_of_graphs():
    torch._dynamo.reset()
    counters.clear()
    step, state = _build(
        sbfunc.policies.jiang_cdf(beta=1.0, history=64), refill=True, others=False
    )
    compiled = torch.compile(step, backend="aot_eager")  # the graphs, not inductor's code
    graphs = []
    for i in range(2 * STEPS):
        state = _at(state, i % STEPS)
        eager_next, em = step(state, _batch(i))
        state, cm = compiled(state, _batch(i))
        _assert_close(eager_next, state)
        assert em.samples_backpropagated == cm.samples_backpropagated
        graphs.append(counters["stats"]["unique_graphs"])
    # Kept counts and queue lengths are data-dependent: the sizes are dynamic after their first
    # change, and sizes 0 and 1 get their own graphs when they first occur, so the count is
    # bounded but may still grow by a graph or two on rare sizes.
    assert graphs[-1] - graphs[STEPS] <= 2, graphs
