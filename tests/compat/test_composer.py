import inspect
import sys

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import sbfunc


def _reference_should(d, b, start, end, interrupt):
    return start <= d < end and (interrupt == 0 or (b + 1) % interrupt != 0)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    st.floats(0, 1),
    st.integers(0, 1000),
    st.floats(0, 1),
    st.floats(0, 1),
    st.one_of(st.just(0), st.integers(2, 10)),
)
def test_should_selective_backprop_matches_composer(d, b, start, end, interrupt):
    start, end = min(start, end), max(start, end)
    assert sbfunc.selective_backprop.should_selective_backprop(
        d, b, start, end, interrupt
    ) == _reference_should(d, b, start, end, interrupt)


@pytest.mark.parametrize(
    ("kwargs", "exc", "msg"),
    [
        ({"interrupt": 1}, ValueError, "interrupt must be 0"),
        ({"interrupt": -2}, ValueError, "interrupt must be 0"),
        ({"interrupt": 2.0}, TypeError, "interrupt must be an int"),
        ({"start": 0.9, "end": 0.5}, ValueError, "start must be <= end"),
        ({"start": -0.1}, ValueError, r"start must be in \[0, 1\]"),
        ({"end": 1.5}, ValueError, r"end must be in \[0, 1\]"),
        ({"current_duration": 1.2}, ValueError, r"current_duration must be in \[0, 1\]"),
        ({"batch_idx": -1}, ValueError, "batch_idx must be an int >= 0"),
    ],
)
def test_should_selective_backprop_errors(kwargs, exc, msg):
    args = {"current_duration": 0.6, "batch_idx": 0, **kwargs}
    with pytest.raises(exc, match=msg):
        sbfunc.selective_backprop.should_selective_backprop(**args)


def _setup(n=32):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(16, 5)
    )
    x, y = torch.randn(n, 1, 8, 8), torch.randint(0, 5, (n,))
    return model, x, y


def test_select_using_loss_prunes_aligned_rows_in_batch_order():
    model, x, y = _setup()
    xs, ys = sbfunc.compat.select_using_loss(
        x, y, model, F.cross_entropy, keep=0.5, generator=torch.Generator().manual_seed(0)
    )
    assert xs.shape == (16, 1, 8, 8) and ys.shape == (16,)
    rows = [int(torch.nonzero((x == r).all(dim=(1, 2, 3)))[0]) for r in xs]
    assert rows == sorted(rows) and len(set(rows)) == 16
    assert torch.equal(ys, y[rows])


def test_select_using_loss_same_generator_same_rows_and_no_grad():
    model, x, y = _setup()
    a = sbfunc.compat.select_using_loss(
        x, y, model, F.cross_entropy, 0.25, 0.5, generator=torch.Generator().manual_seed(3)
    )
    b = sbfunc.compat.select_using_loss(
        x, y, model, F.cross_entropy, 0.25, 0.5, generator=torch.Generator().manual_seed(3)
    )
    assert torch.equal(a[0], b[0]) and not a[0].requires_grad
    assert all(p.grad is None for p in model.parameters())


def test_select_using_loss_prefers_high_loss():
    model, x, y = _setup(64)
    losses = F.cross_entropy(model(x), y, reduction="none").detach()
    hits = torch.zeros(64)
    for seed in range(200):
        _, idx_y = sbfunc.compat.select_using_loss(
            x,
            torch.arange(64),
            model,
            lambda o, t, reduction: F.cross_entropy(o, y[t], reduction=reduction),
            keep=0.25,
            generator=torch.Generator().manual_seed(seed),
        )
        hits[idx_y] += 1
    order = torch.argsort(losses)
    assert hits[order[-16:]].sum() > 3 * hits[order[:16]].sum()


def test_keep_one_batch_of_one():
    model, x, y = _setup(1)
    xs, _ = sbfunc.compat.select_using_loss(x, y, model, F.cross_entropy, keep=0.5)
    assert xs.shape[0] == 1  # Composer returns an empty batch here


@pytest.mark.parametrize(
    ("kwargs", "exc", "msg"),
    [
        ({"scale_factor": 0.5, "input": torch.randn(4, 8)}, ValueError, "3D, 4D, or 5D"),
        ({"scale_factor": 2.0}, ValueError, "scale_factor must be <= 1"),
        ({"scale_factor": 0.0}, ValueError, r"scale_factor must be in \(0, 1\]"),
        ({"scale_factor": float("nan")}, ValueError, r"scale_factor must be in \(0, 1\]"),
        ({"scale_factor": "0.5"}, TypeError, r"scale_factor must be a float in \(0, 1\]"),
        ({"loss_fun": lambda o, t: o.sum()}, TypeError, "keyword argument `reduction`"),
        ({"loss_fun": 3}, TypeError, "callable"),
        ({"keep": 0.0}, ValueError, r"keep must be in \(0, 1\]"),
        ({"keep": 1.5}, ValueError, r"keep must be in \(0, 1\]"),
    ],
)
def test_select_using_loss_errors(kwargs, exc, msg):
    model, x, y = _setup(4)
    args = {"input": x, "target": y, "model": model, "loss_fun": F.cross_entropy, **kwargs}
    if args["input"].dim() == 2:
        args["model"] = nn.Linear(8, 5)
    with pytest.raises(exc, match=msg):
        sbfunc.compat.select_using_loss(**args)


def test_composer_check_order_rank_before_scale_range():
    # Composer checks the input rank before the scale range.
    with pytest.raises(ValueError, match="3D, 4D, or 5D"):
        sbfunc.compat.select_using_loss(
            torch.randn(4, 8), torch.zeros(4), nn.Linear(8, 2), F.cross_entropy, scale_factor=2.0
        )


# Composer 0.32's exact messages (composer/algorithms/selective_backprop/selective_backprop.py),
# in its order of checks: code that matches on them keeps working.
COMPOSER_ERRORS = [
    (
        {"scale_factor": 0.5, "input": torch.randn(4, 8)},
        ValueError,
        "Input must be 3D, 4D, or 5D if scale_factor != 1, got 2",
    ),
    ({"scale_factor": 2.0}, ValueError, "scale_factor must be <= 1"),
    (
        {"loss_fun": lambda o, t: o.sum()},
        TypeError,
        "Loss function `loss_fun` must take a keyword argument `reduction`.",
    ),
    ({"loss_fun": 3}, TypeError, "Loss function must be callable"),
    # order: the rank before the range, the range before the loss function
    (
        {"scale_factor": 2.0, "input": torch.randn(4, 8), "loss_fun": 3},
        ValueError,
        "Input must be 3D, 4D, or 5D if scale_factor != 1, got 2",
    ),
    ({"scale_factor": 2.0, "loss_fun": 3}, ValueError, "scale_factor must be <= 1"),
    # the loss function before our own checks (keep)
    ({"loss_fun": 3, "keep": 0.0}, TypeError, "Loss function must be callable"),
]


@pytest.mark.parametrize(("kwargs", "exc", "message"), COMPOSER_ERRORS)
def test_select_using_loss_raises_composers_exact_messages(kwargs, exc, message):
    model, x, y = _setup(4)
    args = {"input": x, "target": y, "model": model, "loss_fun": F.cross_entropy, **kwargs}
    with pytest.raises(exc) as info:
        sbfunc.compat.select_using_loss(**args)
    assert str(info.value) == message


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_a_loss_module_is_refused_with_composers_message(reduction):
    # Composer reads the signature of the module's __call__, (*args, **kwargs), and refuses
    # every loss module; torch's own TypeError (forward() got an unexpected keyword argument)
    # would name no fix
    model, x, y = _setup(4)
    with pytest.raises(TypeError) as info:
        sbfunc.compat.select_using_loss(x, y, model, nn.CrossEntropyLoss(reduction=reduction))
    assert str(info.value) == "Loss function `loss_fun` must take a keyword argument `reduction`."
    notes = getattr(info.value, "__notes__", [])
    assert len(notes) == (sys.version_info >= (3, 11))  # the fix, in a note (Python 3.11+)
    assert all("torch.nn.functional.cross_entropy" in note for note in notes)


def test_a_loss_module_whose_forward_takes_reduction_still_works():
    class Criterion(nn.Module):
        def forward(self, output, target, reduction="mean"):
            return F.cross_entropy(output, target, reduction=reduction)

    model, x, y = _setup(8)
    xs, ys = sbfunc.compat.select_using_loss(x, y, model, Criterion(), keep=0.5)
    assert xs.shape[0] == ys.shape[0] == 4


@pytest.mark.parametrize("scale_factor", [1, 0.5])
def test_select_using_loss_on_a_dict_batch_points_to_the_pytree_path(scale_factor):
    model, x, y = _setup(4)
    batch = {"x": x, "y": y}
    with pytest.raises(TypeError, match=r"input as a tensor.*got a dict.*score_losses.*take"):
        sbfunc.compat.select_using_loss(
            batch, y, model, F.cross_entropy, scale_factor=scale_factor
        )
    with pytest.raises(TypeError, match=r"target as a tensor.*got a list"):
        sbfunc.compat.select_using_loss(x, y.tolist(), model, F.cross_entropy)
    # Composer's own checks come first, with its messages
    with pytest.raises(ValueError, match="scale_factor must be <= 1"):
        sbfunc.compat.select_using_loss(batch, y, model, F.cross_entropy, scale_factor=2.0)
    with pytest.raises(TypeError, match="Loss function must be callable"):
        sbfunc.compat.select_using_loss(batch, y, model, 3)


def test_select_using_loss_defaults_are_composers():
    params = inspect.signature(sbfunc.compat.select_using_loss).parameters
    assert (params["keep"].default, params["scale_factor"].default) == (0.5, 1)
    should = inspect.signature(sbfunc.selective_backprop.should_selective_backprop).parameters
    assert [should[n].default for n in ("start", "end", "interrupt")] == [0.5, 0.9, 2]


def test_select_using_loss_never_keeps_a_row_with_a_non_finite_loss_it_can_replace():
    model, x, y = _setup(16)

    def loss_fun(out, target, reduction="none"):
        losses = F.cross_entropy(out, target, reduction=reduction)
        return torch.where(torch.arange(16) % 4 == 0, torch.nan, losses)  # rows 0, 4, 8, 12

    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        xs, _ = sbfunc.compat.select_using_loss(x, y, model, loss_fun, keep=0.5, generator=g)
        kept = [i for i in range(16) if any(torch.equal(r, x[i]) for r in xs)]
        assert len(kept) == 8 and not {0, 4, 8, 12} & set(kept)


class _Recorder(nn.Module):
    """Dropout + BatchNorm that records the mode of each scoring forward."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 5), nn.BatchNorm1d(5), nn.Dropout())
        self.modes = []

    def forward(self, x):
        self.modes.append((self.training, self.net[2].training))
        return self.net(x)


# (train, model mode) -> (model mode, BatchNorm mode) in the scoring forward. A model already in
# the requested mode is left alone (its frozen BatchNorm stays frozen).
_MODES = {
    (None, True): (True, False),
    (None, False): (False, False),
    (True, True): (True, False),
    (True, False): (True, True),
    (False, True): (False, False),
    (False, False): (False, False),
}


@pytest.mark.parametrize(("train", "start"), list(_MODES))
def test_select_using_loss_scoring_mode(train, start):
    _, x, y = _setup(8)
    rec = _Recorder().train(start)
    rec.net[2].eval()  # a frozen BatchNorm
    before = [m.training for m in rec.modules()]
    stats = rec.net[2].running_mean.clone()
    sbfunc.compat.select_using_loss(
        x, y, rec, F.cross_entropy, generator=torch.Generator(), train=train
    )
    assert rec.modes == [_MODES[train, start]]
    assert [m.training for m in rec.modules()] == before  # restored, submodule by submodule
    assert torch.equal(rec.net[2].running_mean, stats) != rec.modes[0][1]


def test_select_using_loss_eval_scores_are_deterministic():
    model, x, y = _setup(32)
    net = nn.Sequential(model, nn.Dropout(0.9)).train()
    rows = [
        sbfunc.compat.select_using_loss(
            x, y, net, F.cross_entropy, generator=torch.Generator().manual_seed(0), train=False
        )[1]
        for _ in range(2)
    ]
    assert torch.equal(rows[0], rows[1]) and net.training


def test_select_using_loss_train_needs_a_module():
    model, x, y = _setup(4)
    with pytest.raises(TypeError, match=r"train=False sets the scoring mode of an nn\.Module"):
        sbfunc.compat.select_using_loss(x, y, lambda t: model(t), F.cross_entropy, train=False)
    with pytest.raises(TypeError, match="train must be None, True or False"):
        sbfunc.compat.select_using_loss(x, y, model, F.cross_entropy, train="eval")
    xs, _ = sbfunc.compat.select_using_loss(x, y, lambda t: model(t), F.cross_entropy, train=None)
    assert xs.shape[0] == 2


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_an_integer_fake_loss_selects_like_the_same_loss_as_floats(dtype):
    # Composer's own Selective Backprop test scores with an int64 fake loss.
    x, y = torch.randn(10, 4), torch.randint(0, 3, (10,))
    model = nn.Linear(4, 3)

    def fake(values):
        return lambda output, target, reduction="none": values

    losses = (torch.arange(10) * 7 % 5).to(dtype)
    picked = []
    for values in (losses, losses.to(torch.get_default_dtype())):
        g = torch.Generator().manual_seed(3)
        picked.append(sbfunc.compat.select_using_loss(x, y, model, fake(values), generator=g)[0])
    assert torch.equal(*picked)
