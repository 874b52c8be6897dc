"""Writes an algorithm makes are honoured or refused: a loss changed on AFTER_LOSS or
BEFORE_BACKWARD is what is backpropagated (Composer's meaning); a write nothing reads raises."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import sbfunc
from sbfunc import random as sbrandom
from tests.helpers import split

E = sbfunc.Event
LOSS_EVENTS = [E.AFTER_LOSS, E.BEFORE_BACKWARD]


class Write(sbfunc.Algorithm):
    """On ``event``, replace ``field`` with ``change(state)``."""

    def __init__(self, event, field, change):
        self.event, self.field, self.change = event, field, change

    def match(self, event, state):
        return event == self.event

    def apply(self, event, state):
        return state.replace(**{self.field: self.change(state)})


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))


def _batch(n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 5, generator=g), torch.randint(0, 3, (n,), generator=g)


def _one_step(algorithms=(), *, compile=False, staged=True, **kwargs):
    """The parameters and metrics after one SGD step on the fixed batch."""
    model = _model()
    if staged:
        loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    else:
        inner = sbfunc.per_sample_loss(model, F.cross_entropy)

        def loss_fn(params, buffers, batch):
            return inner(params, buffers, batch)

    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.5), algorithms, **kwargs)
    if compile:
        step.compile(backend="eager", fullgraph=True)
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbrandom.key(0))
    return step(state, _batch())


def _close(a, b, rtol=1e-5, atol=1e-7):
    return all(torch.allclose(a[k], b[k], rtol=rtol, atol=atol) for k in a)


PLAIN = None


def _plain():
    global PLAIN
    if PLAIN is None:
        model = _model()
        start = sbfunc.split_module(model, clone=True)[0]
        state, metrics = _one_step()
        PLAIN = (start, state, metrics)
    return PLAIN


@pytest.mark.parametrize("event", LOSS_EVENTS)
@pytest.mark.parametrize("compile", [False, True])
def test_a_scaled_loss_scales_the_update(event, compile):
    start, plain, m_plain = _plain()
    state, m = _one_step([Write(event, "loss", lambda s: 3.0 * s.loss)], compile=compile)
    up_plain = {k: plain.params[k] - start[k] for k in start}
    up = {k: state.params[k] - start[k] for k in start}
    assert _close(up, {k: 3.0 * v for k, v in up_plain.items()})
    assert torch.allclose(m.loss, 3.0 * m_plain.loss)  # the reported loss is the trained one


@pytest.mark.parametrize("event", LOSS_EVENTS)
def test_new_per_sample_losses_are_averaged_and_backpropagated(event):
    start, _, _ = _plain()
    state, m = _one_step([Write(event, "losses", lambda s: s.losses**2)])
    model = _model()
    x, y = _batch()

    def objective(p):
        out = torch.func.functional_call(model, p, (x,))
        return (F.cross_entropy(out, y, reduction="none") ** 2).mean()

    grads = torch.func.grad(objective)(start)
    assert _close(
        {k: state.params[k] - start[k] for k in start}, {k: -0.5 * g for k, g in grads.items()}
    )
    assert torch.allclose(m.loss, objective(start))


def test_sample_weights_set_on_after_loss_weight_the_loss():
    w = torch.linspace(0.0, 2.0, 12)
    late, m_late = _one_step([Write(E.AFTER_LOSS, "sample_weights", lambda s: w)])
    early, m_early = _one_step([Write(E.BEFORE_LOSS, "sample_weights", lambda s: w)])
    assert _close(late.params, early.params, rtol=0, atol=0)
    assert torch.equal(m_late.loss, m_early.loss)


@pytest.mark.parametrize("event", LOSS_EVENTS)
def test_loss_changes_hold_under_microbatching(event):
    alg = [Write(event, "loss", lambda s: 2.0 * s.loss + 0.0 * s.losses.sum())]
    whole, m_whole = _one_step(alg)
    parts, m_split = _one_step(alg, microbatching=split(size=5))
    assert _close(whole.params, parts.params)
    assert torch.allclose(m_whole.loss, m_split.loss)


@settings(max_examples=15, derandomize=True, database=None, deadline=None)
@given(st.floats(0.0, 10.0), st.sampled_from(LOSS_EVENTS))
def test_the_update_is_linear_in_a_loss_scale(scale, event):
    start, plain, _ = _plain()
    state, _ = _one_step([Write(event, "loss", lambda s: scale * s.loss)])
    for k in start:
        expected = scale * (plain.params[k] - start[k])
        assert torch.allclose(state.params[k] - start[k], expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    ("event", "field", "where"),
    [
        (E.BEFORE_FORWARD, "loss", "AFTER_LOSS or BEFORE_BACKWARD"),
        (E.AFTER_FORWARD, "losses", "AFTER_LOSS or BEFORE_BACKWARD"),
        (E.AFTER_BACKWARD, "loss", "AFTER_LOSS or BEFORE_BACKWARD"),
        (E.BEFORE_LOSS, "grads", "AFTER_BACKWARD"),
        (E.AFTER_TRAIN_BATCH, "grads", "AFTER_BACKWARD"),
        (E.AFTER_BACKWARD, "sample_weights", "BEFORE_BACKWARD"),
        (E.BATCH_END, "sample_weights", "AFTER_DATALOADER"),
        (E.AFTER_LOSS, "outputs", "AFTER_FORWARD or BEFORE_LOSS"),
        (E.BEFORE_FORWARD, "time", "clock"),
    ],
)
def test_a_write_nothing_reads_is_refused_naming_where_it_works(event, field, where):
    def change(s):
        if field == "grads":
            return {k: torch.zeros_like(v) for k, v in s.params.items()}
        if field == "time":
            return s.time._replace(step=s.time.step + 1)
        return torch.ones(12) if field in ("losses", "sample_weights") else torch.ones(())

    with pytest.raises(ValueError, match=rf"Write changed state\.{field} on {event.name}") as e:
        _one_step([Write(event, field, change)])
    assert where in str(e.value)


def test_outputs_need_a_staged_loss():
    alg = Write(E.AFTER_FORWARD, "outputs", lambda s: 0.0 * s.outputs)
    state, m = _one_step([alg])  # per_sample_loss: the criterion reads the new outputs
    assert torch.allclose(m.loss, torch.log(torch.tensor(3.0)))  # uniform logits
    assert _close(state.params, _plain()[0], rtol=0, atol=0)  # a constant loss: no update
    with pytest.raises(ValueError, match="per_sample_loss"):
        _one_step([Write(E.AFTER_FORWARD, "outputs", lambda s: torch.zeros(12, 3))], staged=False)


def test_outside_a_step_only_persistent_fields_are_kept():
    step = sbfunc.make_train_step(
        sbfunc.per_sample_loss(_model(), F.cross_entropy),
        sbfunc.optim.sgd(0.1),
        [Write(E.EPOCH_END, "batch", lambda s: (torch.zeros(1),))],
    )
    state = step.init(*sbfunc.split_module(_model(), clone=True), key=sbrandom.key(0))
    with pytest.raises(ValueError, match="outside a training step only params"):
        step.run_event(E.EPOCH_END, state)


def test_evaluation_keeps_batch_and_outputs_and_refuses_the_loss():
    model = _model()
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)

    def metrics(params, buffers, batch):
        return {"loss": loss_fn(params, buffers, batch).mean()}

    def run(alg):
        step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1), [alg])
        state = step.init(*sbfunc.split_module(model, clone=True), key=sbrandom.key(0))
        return sbfunc.fit(
            step,
            state,
            [_batch()],
            epochs=1,
            evaluator=sbfunc.step.Evaluator(data=[_batch()], fn=metrics),
        )

    halve = Write(E.EVAL_AFTER_FORWARD, "outputs", lambda s: {"loss": s.outputs["loss"] / 2})
    assert run(halve).evaluations[-1].metrics["loss"] < 1.0  # the outputs are the metrics
    with pytest.raises(ValueError, match="evaluation reads only the batch and the outputs"):
        run(Write(E.EVAL_AFTER_FORWARD, "loss", lambda s: torch.ones(())))


def test_composer_loss_interpolation_pattern():
    # Composer's MixUp-style algorithms rebuild the loss on AFTER_LOSS from the per-sample
    # losses: a convex combination with a detached term only scales the gradient.
    def mix(s):
        return 0.75 * s.loss + 0.25 * s.losses.mean().detach()

    start, plain, _ = _plain()
    state, _ = _one_step([Write(E.AFTER_LOSS, "loss", mix)])
    for k in start:
        assert torch.allclose(
            state.params[k] - start[k], 0.75 * (plain.params[k] - start[k]), atol=1e-7
        )
