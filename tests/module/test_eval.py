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


class _KeywordModel(nn.Module):
    """A Hugging Face-shaped model: keyword inputs, a dict result, dropout and BatchNorm."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.norm, self.drop, self.head = nn.BatchNorm1d(4), nn.Dropout(0.5), nn.Linear(4, 3)

    def forward(self, input_ids, attention_mask):
        h = (self.embed(input_ids) * attention_mask[..., None]).sum(1)
        return {"logits": self.head(self.drop(self.norm(h))), "hidden": h}


def _keyword_batch(n=5):
    g = torch.Generator().manual_seed(n)
    return {
        "input_ids": torch.randint(0, 10, (n, 6), generator=g),
        "attention_mask": (torch.rand(n, 6, generator=g) > 0.3).float(),
        "labels": torch.randint(0, 3, (n,), generator=g),
        "text": [f"row {i}" for i in range(n)],
    }


@pytest.mark.parametrize(
    "input",
    [
        ("input_ids", "attention_mask"),
        ["input_ids", "attention_mask"],
        {"input_ids": "input_ids", "attention_mask": "attention_mask"},
    ],
)
def test_predict_reads_a_dict_batch_by_input(input):
    """Before: ``predict(model, params, buffers, dict_batch)`` called ``model(dict_batch)`` and
    failed; ``input=`` reads the arguments as ``per_sample_loss`` does."""
    torch.manual_seed(0)
    model = _KeywordModel().train()
    params, buffers = sbfunc.split_module(model, clone=True)
    batch = _keyword_batch()
    before = copy.deepcopy((params, buffers, batch))
    out = sbfunc.predict(model, params, buffers, batch, input=input)
    ref = copy.deepcopy(model).eval()(batch["input_ids"], batch["attention_mask"])
    torch.testing.assert_close(out["logits"], ref["logits"], rtol=0, atol=0)
    assert_identical((params, buffers, batch), before)
    assert model.training and all(m.training for m in model.modules())


def test_predict_reads_positional_and_callable_inputs():
    model = _model()
    params, buffers = _trained_state(model)
    x = sbrandom.normal(sbrandom.key(3), (6, 4))
    expected = sbfunc.predict(model, params, buffers, x)
    for batch, input in [((x, torch.zeros(6)), 0), ({"x": x}, "x"), ({"x": x}, lambda b: b["x"])]:
        out = sbfunc.predict(model, params, buffers, batch, input=input)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
    bilinear = nn.Bilinear(4, 4, 2)
    y = sbrandom.normal(sbrandom.key(5), (6, 4))
    two = sbfunc.predict(bilinear, *sbfunc.split_module(bilinear), (x, y, None), input=(0, 1))
    torch.testing.assert_close(two, bilinear(x, y), rtol=0, atol=0)  # several positional


def test_predict_with_a_module_loss_equals_eval_outputs():
    torch.manual_seed(0)
    model = _KeywordModel()
    params, buffers = sbfunc.split_module(model, clone=True)
    batch = _keyword_batch()
    for mode in ("train", "eval", "module", "auto"):
        loss_fn = sbfunc.per_sample_loss(
            model,
            F.cross_entropy,
            input=("input_ids", "attention_mask"),
            target="labels",
            output="logits",
            mode=mode,
        )
        before = copy.deepcopy((params, buffers, batch))
        logits = sbfunc.predict(loss_fn, params, buffers, batch)
        expected = sbfunc.module.eval_outputs(loss_fn, params, buffers, batch).outputs
        torch.testing.assert_close(logits, expected, rtol=0, atol=0)
        assert_identical((params, buffers, batch), before)


def test_predict_keeps_the_1_0_calls():
    """Without ``input=`` the arguments are the module's, bit for bit as in 1.0; a tensor given
    as ``input=`` is torch's own keyword argument of that name."""
    model = _model()
    params, buffers = _trained_state(model)
    x = sbrandom.normal(sbrandom.key(4), (5, 4))
    ref = _reference(model, params, buffers, x)
    for out in (
        sbfunc.predict(model, params, buffers, x),
        sbfunc.predict(model, params, buffers, input=x),  # nn.Sequential.forward(input)
        sbfunc.predict(model, params, buffers, x, input=None),
    ):
        torch.testing.assert_close(out, ref, rtol=0, atol=0)


def test_predict_with_input_refuses_what_it_cannot_read():
    model = _KeywordModel()
    params, buffers = sbfunc.split_module(model)
    batch = _keyword_batch()
    names = ("input_ids", "attention_mask")
    with pytest.raises(TypeError, match="takes one batch, got 2 positional"):
        sbfunc.predict(model, params, buffers, batch, batch, input=names)
    with pytest.raises(TypeError, match=r"\['attention_mask'\] both from the batch"):
        sbfunc.predict(model, params, buffers, batch, input=names, attention_mask=None)
    with pytest.raises(KeyError, match="ids"):
        sbfunc.predict(model, params, buffers, batch, input=("ids",))
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, input=names, output="logits")
    for args, kwargs in [((batch, batch), {}), ((batch,), {"input": names}), ((batch,), {"a": 1})]:
        with pytest.raises(TypeError, match=r"predict\(loss_fn, params, buffers, batch\)"):
            sbfunc.predict(loss_fn, params, buffers, *args, **kwargs)
    with pytest.raises(ValueError, match="missing"):
        sbfunc.predict(loss_fn, *sbfunc.split_module(nn.Linear(2, 2)), batch)


def test_predict_on_a_hugging_face_model():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=3,
    )
    torch.manual_seed(0)
    bert = transformers.BertForSequenceClassification(config).train()
    params, buffers = sbfunc.split_module(bert, clone=True)
    batch = {
        "input_ids": torch.randint(1, 50, (4, 7)),
        "attention_mask": torch.ones(4, 7, dtype=torch.long),
        "labels": torch.tensor([0, 1, 2, 0]),
    }
    names = ("input_ids", "attention_mask")
    with torch.no_grad():
        out = sbfunc.predict(bert, params, buffers, batch, input=names)
        ref = copy.deepcopy(bert).eval()(
            batch["input_ids"], attention_mask=batch["attention_mask"]
        )
        loss_fn = sbfunc.per_sample_loss(
            bert, F.cross_entropy, input=names, target="labels", output="logits"
        )
        logits = sbfunc.predict(loss_fn, params, buffers, batch)
    torch.testing.assert_close(out.logits, ref.logits, rtol=0, atol=0)
    torch.testing.assert_close(logits, ref.logits, rtol=0, atol=0)
    assert bert.training
