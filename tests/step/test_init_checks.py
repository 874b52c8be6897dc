"""``step.init`` checks the params and buffers against the module behind ``loss_fn``: the
parameters of another model used to be accepted, and training then changed nothing."""

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sbfunc
from sbfunc import random as sbrandom
from sbfunc.testing import linear_loss


def _model(widths=(6, 8, 3)):
    torch.manual_seed(0)
    layers = []
    for a, b in itertools.pairwise(widths):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _step(model, algorithms=()):
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    return sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.5), algorithms)


@pytest.mark.parametrize(
    ("other", "message"),
    [
        (
            nn.ModuleDict({"fc": nn.Linear(6, 3)}),
            r"^params do not match the module behind loss_fn \(Sequential\): missing "
            r"\['0\.weight', '0\.bias', '2\.weight', '2\.bias'\], "
            r"unexpected \['fc\.weight', 'fc\.bias'\];",
        ),
        (_model((6, 5, 3)), r"shape mismatch \{'0\.weight': \(5, 6\) given, \(8, 6\) expected"),
        (_model((6, 8, 3, 3)), r"unexpected \['4\.weight', '4\.bias'\];"),  # not torch's error
    ],
    ids=["other_names", "other_shapes", "deeper"],
)
def test_init_refuses_the_parameters_of_another_model(other, message):
    step = _step(_model())
    with pytest.raises(ValueError, match=message):
        step.init(*sbfunc.split_module(other), key=sbrandom.key(0))


def test_init_refuses_missing_buffers_and_accepts_what_is_legitimate():
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    step = _step(model)
    params, buffers = sbfunc.split_module(model, clone=True)
    with pytest.raises(ValueError, match=r"^buffers do not match .*missing \['1\.running_mean'"):
        step.init(params, {}, key=sbrandom.key(0))
    step.init(params, buffers, key=sbrandom.key(0))
    half = {k: v.half() for k, v in params.items()}  # another dtype (mixed precision) is fine
    step.init(half, buffers, key=sbrandom.key(0))
    frozen = {k: params.pop(k) for k in ("0.weight", "0.bias")}  # held constant as buffers
    state = step.init(params, {**buffers, **frozen}, key=sbrandom.key(0))
    assert sorted(state.params) == ["1.bias", "1.weight", "2.bias", "2.weight"]
    # a plain loss function has no module to compare with
    plain = sbfunc.make_train_step(linear_loss, sbfunc.optim.sgd(0.1))
    plain.init({"anything": torch.zeros(2)}, {}, key=sbrandom.key(0))


def test_the_right_parameters_train_and_the_check_holds_after_surgery():
    """The step trains what it was given (the issue's run: 20 SGD steps on another model's
    parameters left the loss constant); a model changed by surgery, split after, passes."""
    model = _model()
    step = _step(model)
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbrandom.key(0))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 6, generator=g)
    batch = (x, (x[:, 0] > 0).long())
    first = None
    for _ in range(20):
        state, metrics = step(state, batch)
        first = metrics.loss if first is None else first
    assert metrics.loss < first
    surgery = sbfunc.algorithms._surgery.replace_modules(
        model, lambda name, m: nn.Sequential(m, nn.Identity()) if name == "2" else None
    )
    with pytest.raises(ValueError, match=r"missing \['2\.0\.weight'"):
        _step(surgery).init(*sbfunc.split_module(model), key=sbrandom.key(0))
    _step(surgery).init(*sbfunc.split_module(surgery), key=sbrandom.key(0))
