"""Evaluation as a pure function: ``predict`` and ``eval_outputs`` equal ``model.eval()`` and
write nothing they are given, whatever mode the module was left in."""

import copy

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import sbfunc
from sbfunc import random as sbrandom
from tests.helpers import assert_identical


def _model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 3)
    )


def _trained_state(model):
    """Params and buffers with non-trivial running statistics (a few train-mode passes)."""
    params, buffers = sbfunc.split_module(model, clone=True)
    for i in range(3):
        x = sbrandom.normal(sbrandom.key(100 + i), (16, 4)) * 3 + 1
        torch.func.functional_call(model.train(), (params, buffers), (x,))
    return params, buffers


def _reference(model, params, buffers, x):
    ref = copy.deepcopy(model)
    ref.load_state_dict({**params, **buffers})
    with torch.no_grad():
        return ref.eval()(x)


@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(n=st.integers(1, 9), seed=st.integers(0, 2**32), train_mode=st.booleans())
def test_predict_is_eval_mode_and_writes_nothing(n, seed, train_mode):
    model = _model()
    params, buffers = _trained_state(model)
    model.train(train_mode)
    x = sbrandom.normal(sbrandom.key(seed), (n, 4))
    before = copy.deepcopy((params, buffers, x))
    versions = [t._version for t in (*params.values(), *buffers.values(), x)]
    out = sbfunc.predict(model, params, buffers, x)
    torch.testing.assert_close(out, _reference(model, params, buffers, x), rtol=0, atol=0)
    assert_identical((params, buffers, x), before)
    assert [t._version for t in (*params.values(), *buffers.values(), x)] == versions
    assert model.training is train_mode and all(m.training is train_mode for m in model)


def test_predict_keyword_arguments_and_gradients():
    class Keywords(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x, *, scale):
            return self.lin(x) * scale

    model = Keywords()
    params, buffers = sbfunc.split_module(model)
    x = torch.ones(3, 2)
    out = sbfunc.predict(model, params, buffers, x, scale=2.0)
    torch.testing.assert_close(out, model(x, scale=2.0))
    g = torch.func.grad(lambda p: sbfunc.predict(model, p, buffers, x, scale=1.0).sum())(params)
    assert set(g) == set(params)


def test_predict_guards_buffers_of_layers_that_write_in_eval_mode():
    class Counter(nn.Module):  # a custom layer that writes its buffer whatever the mode
        def __init__(self):
            super().__init__()
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, x):
            self.calls.add_(1)
            return x

    model = Counter()
    params, buffers = sbfunc.split_module(model, clone=True)
    sbfunc.predict(model, params, buffers, torch.ones(2))
    assert int(buffers["calls"]) == 0 and buffers["calls"]._version == 0


@pytest.mark.parametrize("mode", ["train", "eval", "module", "auto"])
def test_eval_outputs_matches_eval_mode_for_every_loss_mode(mode):
    model = _model()
    params, buffers = _trained_state(model)
    model.train()
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode=mode)
    batch = (sbrandom.normal(sbrandom.key(1), (6, 4)), torch.tensor([0, 1, 2, 0, 1, 2]))
    before = copy.deepcopy((params, buffers, batch))
    out = sbfunc.module._eval.eval_outputs(loss_fn, params, buffers, batch)
    ref = _reference(model, params, buffers, batch[0])
    torch.testing.assert_close(out.outputs, ref, rtol=0, atol=0)
    torch.testing.assert_close(
        out.losses, F.cross_entropy(ref, batch[1], reduction="none"), rtol=0, atol=0
    )
    assert_identical((params, buffers, batch), before)
    assert model.training


def test_eval_outputs_reads_structured_batches_and_outputs():
    class Named(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 2)

        def forward(self, features):
            return {"logits": self.lin(features), "aux": features.sum(1)}

    model = Named()
    loss_fn = sbfunc.per_sample_loss(
        model, F.cross_entropy, input={"features": "x"}, target="y", output="logits"
    )
    batch = {"x": torch.ones(2, 3), "y": torch.tensor([0, 1]), "path": ["a", "b"]}
    out = sbfunc.module._eval.eval_outputs(loss_fn, *sbfunc.split_module(model), batch)
    assert out.outputs.shape == (2, 2) and out.losses.shape == (2,)


def test_eval_outputs_refuses_a_hand_written_loss():
    with pytest.raises(TypeError, match=r"ModuleLoss made by sbfunc\.per_sample_loss"):
        sbfunc.module._eval.eval_outputs(
            lambda p, b, batch: batch[0].sum(1), {}, {}, (torch.ones(2, 2),)
        )


@pytest.mark.parametrize("which", ["predict", "eval_outputs"])
def test_params_of_another_model_are_refused(which):
    """Before: ``functional_call`` ignored the unknown names and returned the module's own
    outputs; now the mismatch is named before the module runs."""
    model = _model()
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    batch = (torch.randn(4, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 0]))

    def run(params, buffers):
        if which == "predict":
            return sbfunc.predict(model, params, buffers, batch[0])
        return sbfunc.module._eval.eval_outputs(loss_fn, params, buffers, batch)

    other = nn.ModuleDict({"fc": nn.Linear(4, 3)})
    with pytest.raises(ValueError, match=r"missing \['0\.weight', .*unexpected \['fc\.weight'"):
        run(*sbfunc.split_module(other))
    params, buffers = sbfunc.split_module(model)
    wide = {**params, "4.weight": torch.zeros(5, 8), "4.bias": torch.zeros(5)}
    with pytest.raises(
        ValueError, match=r"shape mismatch \{'4\.weight': \(5, 8\) given, \(3, 8\)"
    ):
        run(wide, buffers)
    wide = {k: v.double() if v.is_floating_point() else v for k, v in buffers.items()}
    assert run({k: v.double() for k, v in params.items()}, wide) is not None  # dtypes may differ
