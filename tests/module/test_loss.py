import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sbfunc


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 3))


def test_split_module_detached_and_named():
    model = _model()
    params, buffers = sbfunc.split_module(model)
    assert set(params) == {n for n, _ in model.named_parameters()}
    assert set(buffers) == {n for n, _ in model.named_buffers()}
    assert not any(p.requires_grad for p in params.values())
    assert params["0.weight"].data_ptr() == model[0].weight.data_ptr()
    cloned, _ = sbfunc.split_module(model, clone=True)
    assert cloned["0.weight"].data_ptr() != model[0].weight.data_ptr()


def test_eval_mode_scores_are_deterministic_and_leave_buffers_alone():
    model = _model().train()
    params, buffers = sbfunc.split_module(model, clone=True)
    before = {k: v.clone() for k, v in buffers.items()}
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)  # mode='auto': eval when called
    batch = (torch.randn(16, 4), torch.randint(0, 3, (16,)))
    a, b = loss_fn(params, buffers, batch), loss_fn(params, buffers, batch)
    assert torch.equal(a, b) and a.shape == (16,)
    assert all(torch.equal(before[k], buffers[k]) for k in buffers)
    assert model.training  # mode restored


def test_train_mode_uses_dropout_and_restores_mode():
    model = _model().eval()
    params, buffers = sbfunc.split_module(model, clone=True)
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    batch = (torch.randn(16, 4), torch.randint(0, 3, (16,)))
    torch.manual_seed(0)
    a = loss_fn(params, buffers, batch)
    b = loss_fn(params, buffers, batch)
    assert not torch.equal(a, b)
    assert not model.training


def test_dict_batches_and_criterion_forms():
    model = nn.Linear(4, 3)
    params, buffers = sbfunc.split_module(model)
    batch = {"image": torch.randn(5, 4), "label": torch.randint(0, 3, (5,)), "id": torch.arange(5)}
    f1 = sbfunc.per_sample_loss(model, F.cross_entropy, input="image", target="label")
    f2 = sbfunc.per_sample_loss(
        model, nn.CrossEntropyLoss(reduction="none"), input="image", target="label"
    )
    f3 = sbfunc.per_sample_loss(
        model, lambda o, t: F.cross_entropy(o, t, reduction="none"), input="image", target="label"
    )
    ref = F.cross_entropy(model(batch["image"]), batch["label"], reduction="none")
    for f in (f1, f2, f3):
        torch.testing.assert_close(f(params, buffers, batch), ref)


def test_element_losses_reduced_by_mean():
    model = nn.Conv1d(2, 3, 1)  # per-position logits: [N, C, L]
    params, buffers = sbfunc.split_module(model)
    x, y = torch.randn(4, 2, 5), torch.randint(0, 3, (4, 5))
    loss = sbfunc.per_sample_loss(model, F.cross_entropy)(params, buffers, (x, y))
    ref = F.cross_entropy(model(x), y, reduction="none").mean(dim=1)
    torch.testing.assert_close(loss, ref)


def test_reducing_criterion_rejected():
    with pytest.raises(ValueError, match="reduction='none'"):
        sbfunc.per_sample_loss(nn.Linear(2, 2), nn.CrossEntropyLoss())
    with pytest.raises(TypeError, match="criterion must be callable"):
        sbfunc.per_sample_loss(nn.Linear(2, 2), "ce")
    with pytest.raises(TypeError, match=r"module must be an nn\.Module"):
        sbfunc.per_sample_loss(lambda x: x, F.cross_entropy)


ALLOWED = r"mode must be 'auto', 'train', 'eval' or 'module'"


@pytest.mark.parametrize(
    ("mode", "exc"),
    [("yes", ValueError), ("Auto", ValueError), (True, TypeError), (None, TypeError)],
)
def test_bad_mode_names_the_allowed_values(mode, exc):
    with pytest.raises(exc, match=ALLOWED):
        sbfunc.per_sample_loss(nn.Linear(2, 2), F.cross_entropy, mode=mode)
    with pytest.raises(exc, match=ALLOWED):
        sbfunc.per_sample_loss(nn.Linear(2, 2), F.cross_entropy).with_mode(mode)


def test_scalar_loss_rejected_at_call():
    model = nn.Linear(2, 2)
    params, buffers = sbfunc.split_module(model)
    loss_fn = sbfunc.per_sample_loss(model, lambda o, t: ((o - t) ** 2).mean())
    with pytest.raises(ValueError, match="per-sample"):
        loss_fn(params, buffers, (torch.randn(3, 2), torch.randn(3, 2)))


def test_loss_fn_composes_with_grad():
    model = nn.Linear(3, 2)
    params, buffers = sbfunc.split_module(model)
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    batch = (torch.randn(6, 3), torch.randint(0, 2, (6,)))
    grads = torch.func.grad(lambda p: loss_fn(p, buffers, batch).mean())(params)
    model.zero_grad()
    F.cross_entropy(model(batch[0]), batch[1]).backward()
    torch.testing.assert_close(grads["weight"], model.weight.grad)


# --- several inputs, structured outputs -------------------------------------------------------


@dataclasses.dataclass
class Out:
    logits: torch.Tensor
    hidden: torch.Tensor | None = None


class TwoInputs(nn.Module):
    """``forward(input_ids, attention_mask)`` returning a structured output of the chosen kind."""

    def __init__(self, kind="dataclass"):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 3)
        self.kind = kind

    def forward(self, input_ids, attention_mask):
        h = (self.embed(input_ids) * attention_mask[..., None]).sum(1)
        logits = self.head(h)
        if self.kind == "dataclass":
            return Out(logits)
        if self.kind == "dict":
            return {"logits": logits, "hidden": h}
        if self.kind == "tuple":
            return logits, None
        return logits


def _text_batch(n=5):
    gen = torch.Generator().manual_seed(0)
    mask = torch.ones(n, 6)
    mask[:, 4:] = 0
    return {
        "input_ids": torch.randint(0, 10, (n, 6), generator=gen),
        "attention_mask": mask,
        "labels": torch.randint(0, 3, (n,), generator=gen),
        "text": [f"sentence {i}" for i in range(n)],
    }


@pytest.mark.parametrize(
    ("kind", "output"),
    [("dataclass", "logits"), ("dict", "logits"), ("tuple", 0), ("dict", lambda o: o["logits"])],
)
def test_keyword_inputs_and_structured_outputs(kind, output):
    model = TwoInputs(kind)
    params, buffers = sbfunc.split_module(model)
    batch = _text_batch()
    loss_fn = sbfunc.per_sample_loss(
        model,
        F.cross_entropy,
        input=("input_ids", "attention_mask"),
        target="labels",
        output=output,
    )
    ref_logits = model.head(
        (model.embed(batch["input_ids"]) * batch["attention_mask"][..., None]).sum(1)
    )
    ref = F.cross_entropy(ref_logits, batch["labels"], reduction="none")
    torch.testing.assert_close(loss_fn(params, buffers, batch), ref)
    assert torch.is_tensor(loss_fn.forward(params, buffers, batch))  # logits only, for vjp
    out, pullback = torch.func.vjp(lambda p: loss_fn.forward(p, buffers, batch), params)
    (grads,) = pullback(torch.ones_like(out))
    assert set(grads) == set(params)
    g = torch.func.grad(lambda p: loss_fn(p, buffers, batch).mean())(params)
    model.zero_grad()
    F.cross_entropy(ref_logits, batch["labels"]).backward()
    torch.testing.assert_close(g["head.weight"], model.head.weight.grad)


def test_positional_and_mapping_inputs():
    model = TwoInputs("plain")
    params, buffers = sbfunc.split_module(model)
    b = _text_batch()
    tup = (b["input_ids"], b["attention_mask"], b["labels"])
    ref = sbfunc.per_sample_loss(model, F.cross_entropy, input=(0, 1), target=2)(
        params, buffers, tup
    )
    renamed = {"ids": b["input_ids"], "mask": b["attention_mask"], "y": b["labels"]}
    by_map = sbfunc.per_sample_loss(
        model, F.cross_entropy, input={"input_ids": "ids", "attention_mask": "mask"}, target="y"
    )
    torch.testing.assert_close(by_map(params, buffers, renamed), ref)
    as_list = sbfunc.per_sample_loss(model, F.cross_entropy, input=["input_ids", "attention_mask"])
    assert as_list.input == ("input_ids", "attention_mask")


def test_structured_output_without_output_is_explained():
    model = TwoInputs("dataclass")
    params, buffers = sbfunc.split_module(model)
    kw = {"input": ("input_ids", "attention_mask"), "target": "labels"}
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, **kw)
    with pytest.raises(TypeError, match=r"an Out with attributes \['hidden', 'logits'\].*output="):
        loss_fn(params, buffers, _text_batch())
    tup = sbfunc.per_sample_loss(TwoInputs("tuple"), F.cross_entropy, **kw)
    with pytest.raises(TypeError, match=r"a tuple of 2 \(Tensor, NoneType\).*output=0"):
        tup.forward(params, buffers, _text_batch())
    for output, exc, msg in [
        ("scores", KeyError, r"output='scores' is not in the module's output, an Out"),
        (3, IndexError, r"output=3 cannot index the module's output, an Out"),
        (lambda o: o.hidden, TypeError, r"selected a NoneType"),
    ]:
        bad = sbfunc.per_sample_loss(model, F.cross_entropy, output=output, **kw)
        with pytest.raises(exc, match=msg):
            bad(params, buffers, _text_batch())
    dict_model = sbfunc.per_sample_loss(TwoInputs("dict"), F.cross_entropy, output="loss", **kw)
    with pytest.raises(KeyError, match=r"a dict with keys \['logits', 'hidden'\]"):
        dict_model(params, buffers, _text_batch())


def test_missing_input_field_names_the_available_ones():
    model = TwoInputs("plain")
    loss_fn = sbfunc.per_sample_loss(
        model, F.cross_entropy, input=("input_ids", "mask"), target="labels"
    )
    with pytest.raises(KeyError, match=r"input='mask' not in batch; available keys: .*attention"):
        loss_fn(*sbfunc.split_module(model), _text_batch())


@pytest.mark.parametrize(
    ("kwargs", "exc", "msg"),
    [
        ({"input": ()}, ValueError, "at least one field"),
        ({"input": ("a", 0)}, TypeError, "only str field names"),
        ({"input": True}, TypeError, "input must be"),
        ({"input": 1.5}, TypeError, "input must be"),
        ({"input": {"x": ("a", "b")}}, TypeError, "single fields"),
        ({"input": {0: "a"}}, ValueError, "str keyword names"),
        ({"output": 1.5}, TypeError, "output must be"),
        ({"output": True}, TypeError, "output must be"),
    ],
)
def test_input_and_output_forms_are_validated(kwargs, exc, msg):
    with pytest.raises(exc, match=msg):
        sbfunc.per_sample_loss(nn.Linear(2, 2), F.cross_entropy, **kwargs)


def test_with_mode_keeps_inputs_and_output():
    loss_fn = sbfunc.per_sample_loss(
        TwoInputs(), F.cross_entropy, input=("input_ids", "attention_mask"), output="logits"
    )
    other = loss_fn.with_mode("train")
    assert (other.input, other.output, other.mode) == (loss_fn.input, "logits", "train")
    assert "output='logits'" in repr(other)


def test_mode_is_restored_per_submodule():
    model = _model().train()
    model[1].eval()  # a frozen BatchNorm inside a training model
    params, buffers = sbfunc.split_module(model, clone=True)
    sbfunc.per_sample_loss(model, F.cross_entropy)(
        params, buffers, (torch.randn(4, 4), torch.zeros(4, dtype=torch.long))
    )
    assert [m.training for m in model] == [True, False, True, True]


@pytest.mark.parametrize("start_mode", [True, False])
def test_auto_is_eval_mode_when_called_and_train_mode_on_request(start_mode):
    model = _model().train(start_mode)
    params, buffers = sbfunc.split_module(model, clone=True)
    auto = sbfunc.per_sample_loss(model, F.cross_entropy)
    assert auto.mode == "auto" and "mode='auto'" in repr(auto)
    batch = (torch.randn(16, 4), torch.randint(0, 3, (16,)))
    before = {k: v.clone() for k, v in buffers.items()}
    evaluated = sbfunc.per_sample_loss(model, F.cross_entropy, mode="eval")
    assert torch.equal(auto(params, buffers, batch), evaluated(params, buffers, batch))
    assert torch.equal(
        auto.forward(params, buffers, batch), evaluated.forward(params, buffers, batch)
    )
    assert all(torch.equal(before[k], buffers[k]) for k in buffers)
    assert model.training is start_mode
    trained = auto.with_mode("train")
    assert trained.mode == "train" and auto.mode == "auto"
    torch.manual_seed(0)
    a = trained(params, buffers, batch)
    torch.manual_seed(0)
    b = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")(params, buffers, batch)
    assert torch.equal(a, b)
    assert int(buffers["1.num_batches_tracked"]) == 2  # train mode updates statistics
    assert trained.with_mode("auto").mode == "auto"


def test_module_mode_keeps_the_modules_own_mode():
    model = _model()
    params, buffers = sbfunc.split_module(model, clone=True)
    batch = (torch.randn(16, 4), torch.randint(0, 3, (16,)))
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="module")
    evaluated = sbfunc.per_sample_loss(model, F.cross_entropy, mode="eval")
    model.eval()
    assert torch.equal(loss_fn(params, buffers, batch), evaluated(params, buffers, batch))
    model.train()
    torch.manual_seed(0)
    a = loss_fn(params, buffers, batch)
    torch.manual_seed(0)
    b = loss_fn.with_mode("train")(params, buffers, batch)
    assert torch.equal(a, b) and model.training


def test_a_step_given_another_models_params_names_the_mismatch():
    """Issue 35 item 9: ``step(state.replace(params=other), batch)`` raised torch's raw
    ``AttributeError: Tiny has no attribute '0'``; it now names the missing and unexpected
    entries and the fix, as ``step.init`` does."""

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(3, 2)

        def forward(self, x):
            return self.a(x)

    model, other = Tiny(), torch.nn.Sequential(torch.nn.Linear(3, 2))
    loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy)
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1))
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))
    state = state.replace(params=sbfunc.split_module(other)[0])
    batch = (torch.randn(4, 3), torch.randint(0, 2, (4,)))
    with pytest.raises(ValueError, match=r"missing \['a.weight', 'a.bias'\].*split_module"):
        step(state, batch)
