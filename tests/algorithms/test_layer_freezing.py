import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import sbfunc
from sbfunc.algorithms._layer_freezing import (
    LayerFreezing,
    freezable_layers,
    freeze_depth,
    freeze_fraction,
)

common = settings(max_examples=40, deadline=None, derandomize=True, database=None)
E = sbfunc.Event


def _net():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 8), nn.Tanh()), nn.Linear(8, 3)
    )


class Spy(sbfunc.Algorithm):
    def __init__(self):
        self.grads = []

    def match(self, event, state):
        return event == E.AFTER_BACKWARD

    def apply(self, event, state):
        self.grads.append(state.grads)
        return state


@common
@given(st.floats(0, 1), st.floats(0, 1), st.floats(0, 0.99), st.floats(0, 1), st.integers(0, 9))
def test_schedule_is_monotone_and_bounded(t1, t2, start, level, layers):
    a, b = sorted((t1, t2))
    fa, fb = freeze_fraction(a, start, level), freeze_fraction(b, start, level)
    assert 0.0 <= fa <= fb <= level + 1e-12
    assert freeze_fraction(start, start, level) == 0.0
    assert freeze_fraction(1.0, start, level) == pytest.approx(level)
    assert 0 <= freeze_depth(layers, fa) <= freeze_depth(layers, fb) <= max(layers - 1, 0)


def test_layers_of_a_module():
    assert freezable_layers(_net()) == ["0", "2.0", "3"]
    assert freezable_layers(nn.Linear(2, 2)) == [""]


def _run(algorithms, elapsed, opt):
    model = _net()
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    step = sbfunc.make_train_step(loss_fn, opt, algorithms)
    state = step.init(
        *sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0), total_steps=len(elapsed)
    )
    start = state.params
    g = torch.Generator().manual_seed(0)
    for t in elapsed:  # chosen fractions (the step's own would be i / len(elapsed))
        state = state.replace(time=state.time._replace(elapsed=t))
        batch = (torch.randn(6, 4, generator=g), torch.randint(0, 3, (6,), generator=g))
        state, _ = step(state, batch)
    return start, state


@pytest.mark.parametrize(
    "opt", [sbfunc.optim.sgd(0.1, momentum=0.9, weight_decay=0.1), sbfunc.optim.adamw(0.01)]
)
def test_frozen_layers_stop_changing_even_with_momentum_and_weight_decay(opt):
    spy = Spy()
    freeze = LayerFreezing(freeze_start=0.0, freeze_level=1.0, layers=_net())
    start, state = _run([spy, freeze], [0.0, 0.2, 0.6, 0.9], opt)
    # depths: 0, int(0.2*2)=0, int(0.6*2)=1, int(0.9*2)=1 -> layer "0" frozen from step 3 on
    assert [float(g["0.weight"].abs().sum()) == 0.0 for g in spy.grads] == [0, 0, 1, 1]
    assert float(spy.grads[-1]["2.0.weight"].abs().sum()) > 0  # the others still train
    _, mid = _run([freeze], [0.0, 0.2], opt)
    assert torch.equal(state.params["0.weight"], mid.params["0.weight"])  # frozen at step 3
    assert not torch.equal(state.params["2.0.weight"], mid.params["2.0.weight"])
    assert not torch.equal(mid.params["0.weight"], start["0.weight"])


def test_zero_level_is_the_plain_step():
    opt = sbfunc.optim.sgd(0.1, momentum=0.9)
    _, a = _run([LayerFreezing(0.0, 0.0, layers=_net())], [0.0, 0.5, 1.0], opt)
    _, b = _run([], [0.0, 0.5, 1.0], opt)
    assert all(torch.equal(a.params[k], b.params[k]) for k in a.params)


def test_prefixes_do_not_catch_other_layers():
    freeze = LayerFreezing(0.0, 1.0, layers=["1", "10"])
    params = {k: torch.ones(1) for k in ("1.w", "10.w", "100.w")}
    state = sbfunc.Context(sbfunc.random.key(0), params, grads=dict(params), matched=1)
    out = freeze.apply(E.AFTER_BACKWARD, state)
    assert [k for k, g in out.grads.items() if float(g) == 0] == ["1.w"]
    assert out.scratch == {"1.w": params["1.w"]}
    moved = out.replace(params={k: v + 1 for k, v in params.items()})
    restored = freeze.apply(E.AFTER_TRAIN_BATCH, moved).params
    assert float(restored["1.w"]) == 1.0 and float(restored["10.w"]) == 2.0


def test_errors():
    with pytest.raises(ValueError, match="freeze_start"):
        LayerFreezing(1.0, layers=["0"])
    with pytest.raises(ValueError, match="freeze_level"):
        LayerFreezing(0.5, 2.0, layers=["0"])
    with pytest.raises(TypeError, match="layers must be"):
        LayerFreezing(layers="0")
