import pytest
import torch
import torch.nn.functional as F
import torchopt
from torch import nn

import sbfunc
from sbfunc import random as sbrandom


def _setup(bn: bool = False, seed: int = 0):
    torch.manual_seed(seed)
    layers = [nn.Linear(6, 16), nn.ReLU()]
    if bn:
        layers.insert(1, nn.BatchNorm1d(16))
    model = nn.Sequential(*layers, nn.Linear(16, 3))
    params, buffers = sbfunc.split_module(model, clone=True)
    return model, params, buffers


def _data(n=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    return x, y


def _state(params, buffers, opt, algorithms=(), elapsed=0.0):
    state = sbfunc.init_state(
        params, buffers, key=sbrandom.key(0), opt_state=opt.init(params), algorithms=algorithms
    )
    return state.replace(time=state.time._replace(elapsed=elapsed))


def test_loss_decreases_on_learnable_task():
    model, params, buffers = _setup()
    opt = torchopt.adam(1e-2)
    step = sbfunc.make_train_step(sbfunc.per_sample_loss(model, F.cross_entropy, train=True), opt)
    state = _state(params, buffers, opt)
    batch = _data(64)
    losses = []
    for _ in range(60):
        state, m = step(state, batch)
        losses.append(float(m.loss))
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize("bn", [False, True])
def test_step_matches_hand_written_autograd(bn):
    model, params, buffers = _setup(bn=bn)
    lr = 0.1
    step = sbfunc.make_train_step(
        sbfunc.per_sample_loss(model, F.cross_entropy, train=True), torchopt.sgd(lr)
    )
    state = _state(params, buffers, torchopt.sgd(lr))
    x, y = _data()
    new_state, _ = step(state, (x, y))
    model.train()
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(new_state.params[name], params[name] - lr * p.grad)
    for name, b in model.named_buffers():  # train-mode BatchNorm statistics advanced
        torch.testing.assert_close(new_state.buffers[name], b)
    assert all(torch.equal(state.params[k], params[k]) for k in params)  # input untouched
    assert new_state.batch is None and new_state.loss is None  # per-batch fields cleared


def test_selective_backprop_gradients_equal_autograd_on_kept_rows():
    model, params, buffers = _setup()
    lr = 0.1
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, train=True)
    sb = sbfunc.SelectiveBackprop(start=0.0, end=1.0, keep=0.25, interrupt=0, loss_fn=loss_fn)
    step = sbfunc.make_train_step(loss_fn, torchopt.sgd(lr), [sb])
    state = _state(params, buffers, torchopt.sgd(lr), [sb])
    x, y = _data(32)
    new_state, metrics = step(state, (x, y, torch.arange(32)))
    assert metrics.samples_backpropagated == 8 and metrics.samples_in_batch == 32
    # Recompute the same selection from the same key, then a plain autograd step on those rows.
    _, sub = sbrandom.split(state.key)
    with torch.no_grad():
        scores = F.cross_entropy(model.eval()(x), y, reduction="none")
    idx = sbfunc.rank_power(scores, 0.25, key=sub).indices
    model.train()
    model.zero_grad()
    F.cross_entropy(model(x[idx]), y[idx]).backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(new_state.params[name], params[name] - lr * p.grad)
    t = new_state.time
    assert (t.samples_forwarded, t.samples_backpropagated) == (32 + 8, 8)


def test_keep_one_equals_plain_step_exactly():
    model, params, buffers = _setup()
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, train=True)
    opt = torchopt.adam(1e-2)
    sb = sbfunc.SelectiveBackprop(start=0.0, end=1.0, keep=1.0, interrupt=0, loss_fn=loss_fn)
    plain = sbfunc.make_train_step(loss_fn, opt)
    selective = sbfunc.make_train_step(loss_fn, opt, [sb])
    s1, s2 = _state(params, buffers, opt), _state(params, buffers, opt, [sb])
    for i in range(5):
        batch = _data(16, seed=i)
        s1, _ = plain(s1, batch)
        s2, _ = selective(s2, batch)
    for k in params:
        assert torch.equal(s1.params[k], s2.params[k])


def test_sample_weights_weight_the_loss():
    model, params, buffers = _setup()

    class Weigh(sbfunc.Algorithm):
        def match(self, event, state):
            return event == sbfunc.Event.AFTER_DATALOADER

        def apply(self, event, state):
            return state.replace(sample_weights=torch.arange(16.0))

    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, train=True)
    step = sbfunc.make_train_step(loss_fn, torchopt.sgd(0.1), [Weigh()])
    state = _state(params, buffers, torchopt.sgd(0.1))
    batch = _data(16)
    _, m = step(state, batch)
    expected = (torch.arange(16.0) * loss_fn(params, buffers, batch)).mean()
    torch.testing.assert_close(m.loss, expected)


def test_plain_loss_fn_fused_path_matches_staged():
    model, params, buffers = _setup()
    staged = sbfunc.per_sample_loss(model, F.cross_entropy, train=True)
    fused = lambda p, b, batch: staged(p, b, batch)  # noqa: E731  (a plain LossFn)
    opt = torchopt.sgd(0.1)
    seen = []

    class Outputs(sbfunc.Algorithm):
        def match(self, event, state):
            return event == sbfunc.Event.AFTER_FORWARD

        def apply(self, event, state):
            seen.append(state.outputs is not None)
            return state

    s1, _ = sbfunc.make_train_step(staged, opt, [Outputs()])(_state(params, buffers, opt), _data())
    s2, _ = sbfunc.make_train_step(fused, opt, [Outputs()])(_state(params, buffers, opt), _data())
    assert seen == [True, False]  # only the staged path has outputs after the forward
    for k in params:
        torch.testing.assert_close(s1.params[k], s2.params[k])


def test_events_fire_in_composer_order():
    model, params, buffers = _setup()
    seen = []

    class Recorder(sbfunc.Algorithm):
        def match(self, event, state):
            return True

        def apply(self, event, state):
            seen.append(event)
            return state

    step = sbfunc.make_train_step(
        sbfunc.per_sample_loss(model, F.cross_entropy), torchopt.sgd(0.1), [Recorder()]
    )
    step(_state(params, buffers, torchopt.sgd(0.1)), _data())
    assert tuple(seen) == sbfunc.BATCH_EVENTS


def test_make_train_step_validation():
    with pytest.raises(TypeError, match="optimizer must have init"):
        sbfunc.make_train_step(lambda p, b, x: x, object())
    with pytest.raises(TypeError, match="loss_fn must be callable"):
        sbfunc.make_train_step(3, torchopt.sgd(0.1))
    with pytest.raises(TypeError, match=r"sbfunc\.Algorithm instances"):
        sbfunc.make_train_step(lambda p, b, x: x, torchopt.sgd(0.1), [lambda s: s])
