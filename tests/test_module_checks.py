"""Errors at the earliest point, naming the fix: one test per row of the table in
docs/how-to/failures.md ("Mistakes a new user makes")."""

import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sbfunc
from sbfunc.module import check_loss_fn
from sbfunc.module_checks import check_target, target_kind
from sbfunc.testing import linear_loss

PER_SAMPLE_FIX = r"sbfunc\.per_sample_loss\(model, torch\.nn\.functional\.cross_entropy\)"


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


# --- the loss function, at construction -------------------------------------------------------


@pytest.mark.parametrize(
    ("loss_fn", "what"),
    [
        (_model(), "got the module Sequential"),
        (nn.CrossEntropyLoss(reduction="none"), "got the module CrossEntropyLoss"),
        (F.cross_entropy, r"got the criterion torch\.nn\.functional\.cross_entropy"),
        (functools.partial(F.cross_entropy, label_smoothing=0.1), "got the criterion"),
        (lambda logits, targets: logits, "cannot take the three positional arguments"),
        (None, "loss_fn must be callable, got None"),
        ("cross_entropy", "must be callable"),
    ],
)
def test_check_loss_fn_refuses_what_is_not_a_per_sample_loss(loss_fn, what):
    with pytest.raises(TypeError, match=what) as err:
        check_loss_fn(loss_fn)
    assert "sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy)" in str(err.value)


class _Callable:
    def __call__(self, params, buffers, batch):
        return batch[0].sum(1)


@pytest.mark.parametrize(
    "loss_fn",
    [
        sbfunc.per_sample_loss(_model(), F.cross_entropy),
        lambda p, b, batch: batch[0].sum(1),
        lambda *args: args[2][0].sum(1),
        _Callable(),
        linear_loss,
        functools.partial(lambda scale, p, b, batch: batch[0].sum(1) * scale, 2.0),
    ],
)
def test_check_loss_fn_accepts_per_sample_losses(loss_fn):
    assert check_loss_fn(loss_fn, "score_fn") is loss_fn


def test_check_loss_fn_names_the_argument():
    with pytest.raises(TypeError, match=r"^score_fn must be a per-sample loss function"):
        check_loss_fn(nn.Linear(2, 2), "score_fn")


@pytest.mark.parametrize(
    "build",
    [
        lambda m: sbfunc.per_sample.batch_grad(m),
        lambda m: sbfunc.per_sample.batch_l2_grad(m),
        lambda m: sbfunc.per_sample.sum_grad_squared(m),
        lambda m: sbfunc.per_sample.variance(m),
        lambda m: sbfunc.SAM(loss_fn=m),
        lambda m: sbfunc.SelectiveBackprop(scoring=sbfunc.Scoring(loss_fn=m)),
    ],
    ids=["batch_grad", "batch_l2_grad", "sum_grad_squared", "variance", "SAM", "SB"],
)
def test_a_module_given_as_loss_is_refused_at_construction(build):
    with pytest.raises(TypeError, match=f"got the module Sequential.*{PER_SAMPLE_FIX}"):
        build(_model())


@pytest.mark.parametrize(
    "build",
    [
        lambda m: sbfunc.make_train_step(m, sbfunc.optim.sgd(0.1)),
        lambda m: sbfunc.score_losses(m, {}, {}, (torch.ones(2, 4), torch.zeros(2))),
    ],
    ids=["make_train_step", "score_losses"],
)
def test_a_module_given_as_loss_is_refused_elsewhere(build):
    with pytest.raises(TypeError, match=f"got the module Sequential.*{PER_SAMPLE_FIX}"):
        build(_model())


def test_select_using_loss_on_a_dict_batch_points_to_the_pure_path():
    batch = {"x": torch.ones(4, 4), "y": torch.zeros(4, dtype=torch.long)}
    g = torch.Generator().manual_seed(0)
    with pytest.raises(TypeError, match=r"score_losses.*take"):
        sbfunc.select_using_loss(batch, batch["y"], _model(), F.cross_entropy, generator=g)


# --- structured outputs without output= -------------------------------------------------------


class _LSTMClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(4, 3, batch_first=True)

    def forward(self, x):
        return self.lstm(x)  # (output, (h, c)), as nn.LSTM returns


class _WithAux(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.lin, self.kind = nn.Linear(4, 3), kind

    def forward(self, x):
        logits = self.lin(x)
        if self.kind == "tuple":
            return logits, logits.square().mean()
        if self.kind == "list":
            return [logits, logits]
        return {"logits": logits, "aux": logits.sum()}


@pytest.mark.parametrize(
    ("model", "x", "fix"),
    [
        (_LSTMClassifier(), torch.randn(2, 5, 4), r"a tuple of 2 \(Tensor, tuple\).*output=0"),
        (_WithAux("tuple"), torch.randn(2, 4), r"a tuple of 2 \(Tensor, Tensor\).*output=0"),
        (_WithAux("list"), torch.randn(2, 4), r"a list of 2.*output=0"),
        (_WithAux("dict"), torch.randn(2, 4), r"a dict with keys.*output='logits'"),
    ],
)
def test_structured_output_without_output_names_the_fix(model, x, fix):
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    batch = (x, torch.zeros(2, dtype=torch.long))
    with pytest.raises(TypeError, match=fix):
        loss_fn(*sbfunc.split_module(model), batch)


def test_whole_structured_output_reaches_a_criterion_that_asks_for_it():
    model = _WithAux("tuple")

    def with_aux(outputs, target):
        logits, aux = outputs
        return F.cross_entropy(logits, target, reduction="none") + aux

    loss_fn = sbfunc.per_sample_loss(model, with_aux, output=lambda out: out)
    batch = (torch.randn(3, 4), torch.tensor([0, 1, 2]))
    assert loss_fn(*sbfunc.split_module(model), batch).shape == (3,)


# --- the criterion's target dtype, on the first batch -----------------------------------------


@pytest.mark.parametrize(
    "criterion",
    [
        F.cross_entropy,
        nn.CrossEntropyLoss(reduction="none"),
        functools.partial(F.cross_entropy, label_smoothing=0.1),
        F.nll_loss,
    ],
    ids=["F.cross_entropy", "CrossEntropyLoss", "partial", "nll_loss"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bool])
def test_class_index_target_dtype_names_the_fix(criterion, dtype):
    model = _model()
    loss_fn = sbfunc.per_sample_loss(model, criterion)
    batch = (torch.randn(4, 4), torch.tensor([0, 1, 1, 0]).to(dtype))
    with pytest.raises(TypeError, match=r"int64 class indices.*\.long\(\).*\(4, 3\)"):
        loss_fn(*sbfunc.split_module(model), batch)


def test_class_targets_that_torch_accepts_pass():
    model = _model()
    params, buffers = sbfunc.split_module(model)
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    x = torch.randn(4, 4)
    probabilities = torch.softmax(torch.randn(4, 3), 1)  # the [N, C] form
    for y in (torch.tensor([0, 1, 2, 0]), torch.tensor([0, 1, 2, 0], dtype=torch.uint8)):
        ref = F.cross_entropy(model(x), y, reduction="none")
        torch.testing.assert_close(loss_fn(params, buffers, (x, y)), ref)
    assert loss_fn(params, buffers, (x, probabilities)).shape == (4,)


@pytest.mark.parametrize(
    "criterion",
    [F.binary_cross_entropy_with_logits, nn.BCEWithLogitsLoss(reduction="none"), F.kl_div],
)
def test_float_target_dtype_names_the_fix(criterion):
    model = _model()
    loss_fn = sbfunc.per_sample_loss(model, criterion)
    batch = (torch.randn(4, 4), torch.ones(4, 3, dtype=torch.long))
    with pytest.raises(TypeError, match=r"floating point.*\.float\(\)"):
        loss_fn(*sbfunc.split_module(model), batch)


def test_unknown_criteria_are_not_checked():
    assert target_kind(F.mse_loss) is None
    assert target_kind(lambda o, t: (o - t).abs()) is None
    check_target(None, torch.zeros(2, 3), "not a tensor")  # nothing to check
    check_target("classes", torch.zeros(2, 3), [0, 1])  # a list: torch reports it


def test_target_check_holds_under_compile():
    model = _model()
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    params, buffers = sbfunc.split_module(model)
    x = torch.randn(4, 4)
    fullgraph = torch.compile(loss_fn, backend="eager", fullgraph=True)  # no break, no sync
    assert fullgraph(params, buffers, (x, torch.tensor([0, 1, 2, 0]))).shape == (4,)
    # the message survives compilation: raised as is, or inside dynamo's report with fullgraph
    with pytest.raises(TypeError, match=r"\.long\(\)"):
        torch.compile(loss_fn, backend="eager")(params, buffers, (x, torch.zeros(4)))
    with pytest.raises(Exception, match=r"\.long\(\)"):
        fullgraph(params, buffers, (x, torch.zeros(4)))
