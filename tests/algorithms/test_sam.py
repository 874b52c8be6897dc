import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import sbfunc
from sbfunc.algorithms import SAM, sam_gradients

common = settings(max_examples=20, deadline=None, derandomize=True, database=None)
E = sbfunc.Event


def _quadratic(params, buffers, batch):
    x, y = batch
    return 0.5 * (x @ params["w"] + params["b"] - y) ** 2


@common
@given(st.integers(0, 2**31 - 1), st.floats(0.0, 2.0), st.integers(1, 6))
def test_gradient_at_the_perturbed_point(seed, rho, n):
    g = torch.Generator().manual_seed(seed)
    params = {
        "w": torch.randn(3, generator=g, dtype=torch.float64),
        "b": torch.zeros((), dtype=torch.float64),
    }
    batch = (
        torch.randn(n, 3, generator=g, dtype=torch.float64),
        torch.randn(n, generator=g, dtype=torch.float64),
    )
    weights = torch.rand(n, generator=g, dtype=torch.float64)

    def grad_at(p):
        p = {k: v.clone().requires_grad_() for k, v in p.items()}
        loss = (weights * _quadratic(p, {}, batch)).mean()
        return dict(zip(p, torch.autograd.grad(loss, list(p.values())), strict=True))

    grads = grad_at(params)
    norm = torch.sqrt(sum((v**2).sum() for v in grads.values()))
    moved = {k: params[k] + rho * grads[k] / (norm + 1e-12) for k in params}
    out = sam_gradients(_quadratic, params, {}, batch, grads, rho=rho, sample_weights=weights)
    expected = grad_at(moved)
    assert all(torch.allclose(out[k], expected[k]) for k in params)
    if rho == 0.0:  # zero strength: the plain gradient
        assert all(torch.allclose(out[k], grads[k]) for k in params)


def _model(dropout=False):
    torch.manual_seed(0)
    layers = [nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)]
    if dropout:
        layers.insert(2, nn.Dropout(0.3))
    return nn.Sequential(*layers)


def _run(algorithms_for, dropout=False, steps=2, key=0):
    model = _model(dropout)
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1), algorithms_for(model, loss_fn))
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(key))
    g = torch.Generator().manual_seed(0)
    traces = []
    for _ in range(steps):
        state, metrics = step(
            state, (torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g))
        )
        traces.append(metrics.traces)
    return state, traces


def test_zero_rho_is_the_plain_step_and_rho_changes_it():
    plain, _ = _run(lambda m, f: [])
    zero, _ = _run(lambda m, f: [SAM(rho=0.0, loss_fn=f)])
    sam, _ = _run(lambda m, f: [SAM(rho=0.5, loss_fn=f)])
    assert all(torch.allclose(plain.params[k], zero.params[k]) for k in plain.params)
    assert any(not torch.allclose(plain.params[k], sam.params[k]) for k in plain.params)


def test_interval_is_decided_on_the_host():
    _, traces = _run(lambda m, f: [SAM(interval=2, loss_fn=f)], steps=4)
    ran = [any(t.name == "SAM" for t in step) for step in traces]
    assert ran == [False, True, False, True]  # (step + 1) % 2 == 0, as in Composer


def test_keyed_dropout_makes_the_second_forward_reproducible():
    alg = lambda m, f: [SAM(rho=0.1, loss_fn=f)]  # noqa: E731
    assert alg(None, sbfunc.per_sample_loss(_model(True), F.cross_entropy))[0].keyed
    a, _ = _run(alg, dropout=True)
    b, _ = _run(alg, dropout=True)
    assert all(torch.equal(a.params[k], b.params[k]) for k in a.params)


class Spy(sbfunc.Algorithm):
    """Records the view on AFTER_BACKWARD (FILO: listed before SAM, it runs after it)."""

    def __init__(self, name):
        self.name, self.seen = name, []

    def match(self, event, state):
        return event == E.AFTER_BACKWARD

    def apply(self, event, state):
        self.seen.append(state)
        return state


@common
@given(st.sampled_from([0.5, 1.0, 3.0]), st.integers(0, 1000))
def test_second_gradient_uses_the_kept_rows_and_their_weights(beta, seed):
    rows, after, before, sams = [], Spy("after"), Spy("before"), []

    def algorithms(model, loss_fn):
        def recording(params, buffers, batch):
            rows.append(batch[0])
            return loss_fn(params, buffers, batch)

        score = sbfunc.per_sample_loss(model, F.cross_entropy)
        policy = sbfunc.policies.jiang_cdf(beta, reweight=True)
        sb = sbfunc.SelectiveBackprop(
            0.0, 1.0, interrupt=0, policy=policy, scoring=sbfunc.score.Scoring(loss_fn=score)
        )
        sams.append((loss_fn, SAM(rho=0.1, loss_fn=recording)))
        return [sb, after, sams[0][1], before]

    _run(algorithms, steps=1, key=seed)
    (kept,), (done,) = before.seen, after.seen
    assert kept.sample_weights is not None
    assert len(rows) == 1 and torch.equal(rows[0], kept.batch[0])  # SAM saw the kept rows
    expected = sam_gradients(
        sams[0][0],
        kept.params,
        kept.buffers,
        kept.batch,
        kept.grads,
        rho=0.1,
        sample_weights=kept.sample_weights,
    )
    assert all(torch.allclose(done.grads[k], expected[k]) for k in expected)


def test_errors():
    f = _quadratic
    with pytest.raises(ValueError, match="rho"):
        SAM(rho=-1.0, loss_fn=f)
    with pytest.raises(ValueError, match="interval must be an int >= 1"):
        SAM(interval=0, loss_fn=f)
    with pytest.raises(TypeError, match="loss_fn"):
        SAM(loss_fn=None)
    state = sbfunc.Context(sbfunc.random.key(0))
    with pytest.raises(RuntimeError, match="without gradients"):
        SAM(loss_fn=f).apply(E.AFTER_BACKWARD, state)
