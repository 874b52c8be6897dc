"""Errors at the earliest point, naming the fix: one test per row of the table in
docs/how-to/failures.md ("Mistakes a new user makes")."""

import functools
import itertools

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import sbfunc
from sbfunc.module import check_loss_fn, check_state, check_target, target_kind
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
        lambda m: sbfunc.algorithms.SAM(loss_fn=m),
        lambda m: sbfunc.SelectiveBackprop(scoring=sbfunc.score.Scoring(loss_fn=m)),
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
        lambda m: sbfunc.score.score_losses(m, {}, {}, (torch.ones(2, 4), torch.zeros(2))),
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
        sbfunc.compat.select_using_loss(batch, batch["y"], _model(), F.cross_entropy, generator=g)


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


# --- params and buffers against the module behind the loss ------------------------------------


def _net(widths=(4, 3, 2)):
    layers = []
    for a, b in itertools.pairwise(widths):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


@pytest.mark.parametrize(
    ("other", "message"),
    [
        (  # another model's names
            nn.ModuleDict({"fc": nn.Linear(4, 2)}),
            r"^params do not match the module behind loss_fn \(Sequential\): missing "
            r"\['0\.weight', '0\.bias', '2\.weight', '2\.bias'\], "
            r"unexpected \['fc\.weight', 'fc\.bias'\]; .*sbfunc\.split_module",
        ),
        (  # same names, other shapes
            _net((4, 3, 5)),
            r"shape mismatch \{'2\.weight': \(5, 3\) given, \(2, 3\) expected, "
            r"'2\.bias': \(5,\) given, \(2,\) expected\}",
        ),
        (_net((4, 3, 2, 2)), r"params do .*: unexpected \['4\.weight', '4\.bias'\];"),  # deeper
        (nn.Sequential(nn.Linear(4, 3)), r"missing \['2\.weight', '2\.bias'\];"),  # shallower
    ],
    ids=["other_names", "other_shapes", "deeper", "shallower"],
)
def test_check_state_names_missing_unexpected_and_mismatched_entries(other, message):
    loss_fn = sbfunc.per_sample_loss(_net(), F.cross_entropy)
    with pytest.raises(ValueError, match=message):
        check_state(loss_fn, *sbfunc.split_module(other))


def test_check_state_truncates_long_lists_and_names_buffers():
    loss_fn = sbfunc.per_sample_loss(_net(), F.cross_entropy)
    wide = nn.Sequential(*[nn.Linear(2, 2) for _ in range(10)])
    with pytest.raises(
        ValueError, match=r"unexpected \[('\d\.(weight|bias)', ){6}\.\.\. 10 more\]"
    ):
        check_state(loss_fn, *sbfunc.split_module(wide))
    bn = nn.BatchNorm1d(3)
    params = dict(bn.named_parameters())
    with pytest.raises(ValueError, match=r"^buffers do not match module \(BatchNorm1d\): missing"):
        check_state(bn, params, {}, name="module")


def _tied():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.head = nn.Embedding(5, 3), nn.Linear(3, 5, bias=False)
            self.head.weight = self.embed.weight
            self.register_buffer("ids", torch.arange(5), persistent=False)

        def forward(self, x):
            return self.head(self.embed(x + self.ids[0]).mean(1))

    return Tied()


def test_check_state_allows_dtypes_tied_names_frozen_params_and_derived_buffers():
    model = _net()
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    params, buffers = sbfunc.split_module(model)
    check_state(loss_fn, {k: v.half() for k, v in params.items()}, buffers)  # mixed precision
    frozen = {k: params.pop(k) for k in ("0.weight", "0.bias")}
    check_state(loss_fn, params, frozen)  # a parameter held constant, passed as a buffer
    tied = _tied()
    tied_loss = sbfunc.per_sample_loss(tied, F.cross_entropy)
    p, b = sbfunc.split_module(tied)
    assert list(p) == ["embed.weight"] and list(b) == ["ids"]
    check_state(tied_loss, p, b)
    check_state(tied_loss, {"head.weight": p["embed.weight"]}, b)  # either name of a tied one
    check_state(tied_loss, dict(tied.named_parameters(remove_duplicate=False)), b)  # both
    check_state(tied_loss, p, {})  # a non-persistent buffer is not state (state_dict lacks it)
    lazy = nn.Sequential(nn.LazyLinear(2))
    check_state(lazy, {"0.weight": torch.zeros(2, 7), "0.bias": torch.zeros(2)}, {})


def test_check_state_leaves_plain_losses_alone_and_checks_types():
    for loss_fn in (linear_loss, lambda p, b, batch: batch[0].sum(1), _Callable()):
        check_state(loss_fn, {"anything": torch.zeros(1)}, {"else": torch.zeros(2)})
    loss_fn = sbfunc.per_sample_loss(_net(), F.cross_entropy)
    params, buffers = sbfunc.split_module(_net())
    with pytest.raises(TypeError, match=r"params\['0\.bias'\] must be a tensor, got 1"):
        check_state(loss_fn, {**params, "0.bias": 1}, buffers)
    with pytest.raises(TypeError, match="buffers must be a dict of name -> tensor"):
        check_state(loss_fn, params, [])


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(data=st.data())
def test_check_state_reports_exactly_what_differs(data):
    model = _net((3, 4, 4, 2))
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    params, buffers = sbfunc.split_module(model)
    names = list(params)
    dropped = data.draw(st.lists(st.sampled_from(names), unique=True, max_size=3))
    kept = [k for k in names if k not in dropped]
    reshaped = data.draw(st.lists(st.sampled_from(kept), unique=True, max_size=2)) if kept else []
    extra = data.draw(st.lists(st.sampled_from(["x.w", "y.b", "5.weight"]), unique=True))
    given_params = {
        k: torch.zeros(params[k].numel() + 1) if k in reshaped else params[k] for k in kept
    }
    given_params.update({k: torch.zeros(1) for k in extra})
    if not (dropped or reshaped or extra):
        check_state(loss_fn, given_params, buffers)
        return
    with pytest.raises(ValueError) as err:
        check_state(loss_fn, given_params, buffers)
    text = str(err.value)
    assert all(f"{k!r}" in text for k in [*dropped, *reshaped, *extra])
    assert all(f"{k!r}" not in text for k in kept if k not in reshaped)
    assert ("missing" in text) == bool(dropped) and ("unexpected" in text) == bool(extra)
    assert ("shape mismatch" in text) == bool(reshaped)


def test_check_state_checks_nothing_while_compiling():
    model = _net()
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    params, buffers = sbfunc.split_module(model)

    def f(p, b):
        check_state(loss_fn, p, b)
        return p["0.weight"].sum()

    torch.compile(f, backend="eager", fullgraph=True)(params, buffers)  # no graph break
