import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import sbfunc
from sbfunc import random as sbrandom
from sbfunc.algorithms import StochasticBranch, StochasticDepth

common = settings(max_examples=25, deadline=None, derandomize=True, database=None)


class Residual(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.branch = nn.Sequential(nn.Linear(width, width), nn.Tanh())

    def forward(self, x):
        return x + self.branch(x)


def _net(depth=3, width=4):
    torch.manual_seed(0)
    return nn.Sequential(*(Residual(width) for _ in range(depth)), nn.Linear(width, 2))


def _is_branch(name, m):
    return name.endswith(".branch")


@common
@given(st.sampled_from(["block", "sample"]), st.integers(0, 2**31 - 1), st.integers(0, 1000))
def test_drops_are_whole_rows_or_blocks_and_a_function_of_the_key(method, seed, k):
    net = _net(depth=1)
    new = StochasticDepth(_is_branch, method, drop_rate=0.5)(net)
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(seed))
    with sbrandom.keyed(sbrandom.key(k)):
        out = new[0](x)
    with sbrandom.keyed(sbrandom.key(k)):
        again = new[0](x)
    assert torch.equal(out, again)
    kept = (out == net[0](x)).all(1)
    dropped = (out == x).all(1)
    assert bool((kept | dropped).all())
    if method == "block":
        assert bool(kept.all()) or bool(dropped.all())


@common
@given(
    st.sampled_from(["block", "sample"]),
    st.sampled_from(["linear", "uniform"]),
    st.integers(0, 2**31 - 1),
)
def test_zero_rate_preserves_the_function(method, distribution, seed):
    net = _net()
    new = StochasticDepth(_is_branch, method, 0.0, distribution)(net)
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(seed))
    with sbrandom.keyed(sbrandom.key(seed)):
        assert torch.equal(new(x), net(x))
    new.eval()
    assert torch.equal(new(x), net(x))


def test_eval_scales_the_branch_and_rates_follow_the_distribution():
    net = _net(depth=4)
    new = StochasticDepth(_is_branch, "sample", 0.8, "linear")(net)
    rates = [
        float(m.stochastic_depth_rate) for m in new.modules() if isinstance(m, StochasticBranch)
    ]
    assert rates == pytest.approx([0.2, 0.4, 0.6, 0.8])
    uniform = StochasticDepth(_is_branch, "block", 0.3, "uniform")(net)
    assert all(float(b.branch.stochastic_depth_rate) == pytest.approx(0.3) for b in uniform[:4])
    new.eval()
    x = torch.randn(3, 4)
    torch.testing.assert_close(new[0](x), x + 0.8 * net[0].branch(x))
    assert "0.branch.branch.0.weight" in dict(new.named_parameters())  # wrapped, renamed


def _train(model, algorithms, steps=3, key=0):
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1), algorithms, keyed_model=True)
    state = step.init(
        *sbfunc.split_module(model, clone=True), key=sbrandom.key(key), total_steps=steps
    )
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):  # the step advances time.elapsed: t / steps before step t
        state, _ = step(
            state, (torch.randn(8, 4, generator=g), torch.randint(0, 2, (8,), generator=g))
        )
    return state


def test_a_keyed_step_is_reproducible_and_warms_the_rate_up():
    sd = StochasticDepth(_is_branch, "sample", 0.5, drop_warmup=0.5)
    model = sd(_net())
    assert float(model[0].branch.stochastic_depth_scale) == 0.0  # warm-up starts at zero
    a, b = _train(model, [sd]), _train(model, [sd])
    assert all(torch.equal(a.params[k], b.params[k]) for k in a.params)
    c = _train(model, [sd], key=1)
    assert any(not torch.equal(a.params[k], c.params[k]) for k in a.params)
    # the last step ran at elapsed 2/3 > drop_warmup: the full rate
    assert float(a.buffers["0.branch.stochastic_depth_scale"]) == 1.0


@common
@given(st.floats(0.0, 1.0), st.floats(0.01, 1.0))
def test_warmup_factor(elapsed, warmup):
    sd = StochasticDepth(_is_branch, drop_warmup=warmup)
    _, buffers = sbfunc.split_module(sd(_net(depth=2)))
    state = sbfunc.Context(sbrandom.key(0), buffers=buffers, time=sbfunc.Time(elapsed=elapsed))
    assert sd.match(sbfunc.Event.BATCH_START, state)
    out = sd.apply(sbfunc.Event.BATCH_START, state).buffers
    scales = [v for k, v in out.items() if k.endswith("stochastic_depth_scale")]
    assert len(scales) == 2
    expected = min(1.0, elapsed / warmup)
    assert all(float(s) == pytest.approx(expected, rel=1e-5, abs=1e-6) for s in scales)
    assert not StochasticDepth(_is_branch).match(sbfunc.Event.BATCH_START, state)


def test_errors():
    with pytest.raises(ValueError, match="stochastic_method"):
        StochasticDepth(_is_branch, "layer")
    with pytest.raises(ValueError, match="drop_distribution"):
        StochasticDepth(_is_branch, drop_distribution="cosine")
    with pytest.raises(ValueError, match="drop_rate"):
        StochasticDepth(_is_branch, drop_rate=1.5)
    with pytest.raises(ValueError, match="matches no module"):
        StochasticDepth(["nope"])(_net())
    sd = StochasticDepth(_is_branch, drop_warmup=0.5)
    state = sbfunc.Context(sbrandom.key(0), buffers={}, time=sbfunc.Time())
    with pytest.raises(RuntimeError, match="apply the surgery first"):
        sd.apply(sbfunc.Event.BATCH_START, state)
