"""The per-row signals of the scoring forward: what they equal, what they leave alone, their
errors, and the closed-form last-layer gradient they feed (checked against torch.func)."""

import re

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import sbfunc
from sbfunc.policies import gradient_gram, last_layer_errors, make_policy
from sbfunc.score import SIGNALS, Signals, SignalScorer, score_signals
from sbfunc.score._signals import check_needs, check_signals, find_head
from sbfunc.select import Selection
from tests.meta import META, host_read, to_meta

ALL = frozenset(SIGNALS)


def mlp(d_in: int = 4, hidden: int = 8, classes: int = 3) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(d_in, hidden), nn.Tanh(), nn.Linear(hidden, classes))


def cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv1d(1, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool1d(2), nn.Flatten(),
        nn.Linear(8, 3),
    )  # fmt: skip


def batch_of(n: int, d_in: int = 4, classes: int = 3, seed: int = 1) -> tuple:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d_in, generator=g), torch.randint(0, classes, (n,), generator=g)


def test_signals_equal_the_model_s_own_tensors():
    model = mlp()
    scorer = SignalScorer(sbfunc.per_sample_loss(model, F.cross_entropy), ALL)
    batch = batch_of(6)
    losses, sig = score_signals(scorer, *sbfunc.split_module(model), batch)
    with torch.no_grad():
        features = model[1](model[0](batch[0]))
        logits = model[2](features)
    torch.testing.assert_close(sig.features, features)
    torch.testing.assert_close(sig.logits, logits)
    torch.testing.assert_close(losses, F.cross_entropy(logits, batch[1], reduction="none"))
    assert sig.targets is batch[1] and not sig.features.requires_grad


def test_only_the_needed_signals_are_returned():
    model = mlp()
    scorer = SignalScorer(sbfunc.per_sample_loss(model, F.cross_entropy), {"logits"})
    _, sig = score_signals(scorer, *sbfunc.split_module(model), batch_of(3))
    assert sig.features is None and sig.targets is None and sig.logits.shape == (3, 3)


def test_the_user_s_module_is_left_alone():
    model = mlp()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    scorer = SignalScorer(sbfunc.per_sample_loss(model, F.cross_entropy), ALL)
    score_signals(scorer, *sbfunc.split_module(model), batch_of(4))
    assert all(not m._forward_hooks for m in model.modules())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    twin = scorer.loss_fn.module  # shares the tensors, not the modules
    assert twin is not model and twin[0].weight is model[0].weight


def test_the_features_follow_the_parameters_passed_in():
    model = mlp()
    scorer = SignalScorer(sbfunc.per_sample_loss(model, F.cross_entropy), {"features"})
    params, buffers = sbfunc.split_module(model, clone=True)
    params = {k: v * 2 for k, v in params.items()}
    _, sig = score_signals(scorer, params, buffers, batch_of(4))
    with torch.no_grad():
        x = batch_of(4)[0]
        expected = torch.tanh(x @ params["0.weight"].T + params["0.bias"])
    torch.testing.assert_close(sig.features, expected)


def test_features_are_flattened_per_row_and_downsampled_scoring_works():
    model = cnn()
    scorer = SignalScorer(sbfunc.per_sample_loss(model, F.cross_entropy), ALL)
    batch = (torch.randn(5, 1, 8), torch.randint(0, 3, (5,)))
    losses, sig = score_signals(scorer, *sbfunc.split_module(model), batch, scale_factor=0.5)
    assert sig.features.shape == (5, 8) and losses.shape == (5,)


def test_reduced_precision_signals_come_back_as_float32():
    model = mlp()
    scorer = SignalScorer(sbfunc.per_sample_loss(model, F.cross_entropy), ALL)
    losses, sig = score_signals(
        scorer, *sbfunc.split_module(model), batch_of(4), dtype=torch.bfloat16
    )
    assert losses.dtype == sig.logits.dtype == sig.features.dtype == torch.float32
    assert sig.targets.dtype == torch.int64


def test_an_empty_batch_runs_no_forward():
    model = mlp()
    scorer = SignalScorer(sbfunc.per_sample_loss(model, F.cross_entropy), ALL)
    losses, sig = score_signals(scorer, *sbfunc.split_module(model), batch_of(0))
    assert losses.shape == (0,) and sig == Signals()


HEAD_FIX = "pass SelectiveBackprop(scoring=sbfunc.score.Scoring(head='<name of the layer that"


def test_the_head_is_the_one_named_or_found_in_the_forward():
    model = nn.Sequential(nn.Linear(4, 8), nn.Sequential(nn.ReLU(), nn.Linear(8, 3)))
    assert find_head(model) is None  # found by the forward
    assert find_head(model, "0") == "0"
    with pytest.raises(ValueError, match="head='fc' names no submodule"):
        find_head(model, "fc")
    with pytest.raises(ValueError, match=re.escape(HEAD_FIX)):
        find_head(nn.Sequential(nn.Conv1d(1, 1, 1)))


class WithUnusedLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body, self.fc = nn.Linear(4, 8), nn.Linear(8, 3)
        self.unused = nn.Linear(2, 2)  # the last Linear in module order, never called

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.tanh(self.body(x)))


def test_a_named_head_the_forward_never_calls_is_an_error_naming_the_fix():
    model = WithUnusedLinear()
    named = SignalScorer(sbfunc.per_sample_loss(model, F.cross_entropy), {"features"}, "unused")
    message = "the head 'unused' was not called by the model's forward; name the layer whose "
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        score_signals(named, *sbfunc.split_module(model), batch_of(2))
    assert HEAD_FIX in str(error.value)
    scorer = SignalScorer(sbfunc.per_sample_loss(model, F.cross_entropy), {"features"})
    _, sig = score_signals(scorer, *sbfunc.split_module(model), batch_of(2))  # fc, not unused
    with torch.no_grad():
        torch.testing.assert_close(sig.features, torch.tanh(model.body(batch_of(2)[0])))


class HeadFirst(nn.Module):
    """The head registered before the body: the last Linear in module order is the body's."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.head = nn.Linear(32, 3)
        self.body = nn.Sequential(nn.Linear(4, 32), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def test_the_head_is_the_layer_that_returns_the_logits_not_the_last_registered():
    model = HeadFirst()
    scorer = SignalScorer(sbfunc.per_sample_loss(model, F.cross_entropy), ALL)
    batch = batch_of(5)
    for _ in range(2):  # every forward finds the head the same way; the scorer never changes
        _, sig = score_signals(scorer, *sbfunc.split_module(model), batch)
        with torch.no_grad():
            torch.testing.assert_close(sig.features, model.body(batch[0]))
        assert sig.features.shape == (5, 32)
    hooked = [n for n, m in scorer.loss_fn.module.named_modules() if m._forward_hooks]
    assert hooked == ["head", "body.0"]  # the private copy's Linears, never the user's model
    assert all(not m._forward_hooks for m in model.modules())


class ScaledLogits(nn.Module):
    def __init__(self, aux: bool) -> None:
        super().__init__()
        self.body, self.fc, self.aux = nn.Linear(4, 8), nn.Linear(8, 3), nn.Linear(8, 1)
        self.with_aux = aux

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.body(x))
        if self.with_aux:  # a Linear called after the head, its output unused
            logits = self.fc(h)
            self.aux(h)
            return logits
        return self.fc(h) / 2.0  # the head's output changed after it


@pytest.mark.parametrize("aux", [False, True])
def test_a_forward_whose_last_linear_does_not_return_the_logits_names_the_fix(aux):
    model = ScaledLogits(aux)
    scorer = SignalScorer(sbfunc.per_sample_loss(model, F.cross_entropy), {"features"})
    last = "aux" if aux else "fc"
    message = (
        f"the last nn.Linear the model's forward called, '{last}', does not return the logits"
    )
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        score_signals(scorer, *sbfunc.split_module(model), batch_of(2))
    assert HEAD_FIX in str(error.value)
    named = SignalScorer(sbfunc.per_sample_loss(model, F.cross_entropy), {"features"}, "fc")
    _, sig = score_signals(named, *sbfunc.split_module(model), batch_of(2))
    assert sig.features.shape == (2, 8)


def test_a_forward_that_calls_no_linear_names_the_fix():
    class ConvHead(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.unused = nn.Conv1d(1, 3, 4), nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(x.unsqueeze(1)).flatten(1)

    model = ConvHead()
    scorer = SignalScorer(sbfunc.per_sample_loss(model, F.cross_entropy), {"features"})
    with pytest.raises(ValueError, match=r"the model's forward called no nn\.Linear") as error:
        score_signals(scorer, *sbfunc.split_module(model), batch_of(2))
    assert HEAD_FIX in str(error.value)


@pytest.mark.parametrize(
    ("needs", "error", "match"),
    [
        ("logits", TypeError, "collection of signal names"),
        (["logits", "gradients"], ValueError, r"may name only .* got \['gradients'\]"),
        (3, TypeError, "collection"),
    ],
)
def test_needs_are_validated(needs, error, match):
    with pytest.raises(error, match=match):
        check_needs(needs)


def test_signals_need_a_module_loss():
    def loss(params, buffers, batch):
        return batch[0].sum(1)

    with pytest.raises(TypeError, match="per_sample_loss"):
        SignalScorer(loss, {"logits"})


def _largest_feature_norm(scores, state, args):
    return Selection(args.signals.features.norm(dim=1).argmax().reshape(1)), state


def test_make_policy_checks_the_signals_it_needs():
    policy = make_policy(lambda: (), _largest_feature_norm, needs={"features"})
    assert policy.needs == frozenset({"features"})
    features = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0]])
    sel, _ = policy.select(
        torch.zeros(3), (), key=sbfunc.random.key(0), signals=Signals(features=features)
    )
    assert sel.indices.tolist() == [1]
    with pytest.raises(ValueError, match="reads the signal 'features'"):
        policy.select(torch.zeros(3), (), key=sbfunc.random.key(0))
    with pytest.raises(ValueError, match=r"one row per score \(2\)"):
        policy.select(
            torch.zeros(2), (), key=sbfunc.random.key(0), signals=Signals(features=features)
        )
    with pytest.raises(ValueError, match="no score_rows"):
        make_policy(lambda: (), _largest_feature_norm, lambda s, i, e: i > 0, needs={"logits"})
    assert check_signals(None, frozenset(), 3) == Signals()


def _sb_step(model, needs=ALL, backend=None, head=None):
    def rule(scores, state, args):
        s = args.signals
        gram = gradient_gram(last_layer_errors(s.logits, s.targets), s.features)
        return Selection(torch.topk(gram.diagonal(), 2).indices.sort().values), state + 1

    policy = make_policy(lambda: torch.zeros(()), rule, needs=needs)
    sb = sbfunc.SelectiveBackprop(
        0.0, 1.0, interrupt=0, policy=policy, scoring=sbfunc.score.Scoring(head=head)
    )
    step = sbfunc.make_train_step(
        sbfunc.per_sample_loss(model, F.cross_entropy), sbfunc.optim.sgd(0.1), [sb]
    )
    if backend is not None:
        step.compile(backend=backend, fullgraph=True)
    return step


@pytest.mark.parametrize("make_model", [mlp, HeadFirst])
def test_selective_backprop_hands_the_policy_its_signals_eagerly_and_compiled(make_model):
    model = make_model()
    batch = batch_of(6)
    results = []
    for backend in (None, "eager"):
        step = _sb_step(model, backend=backend)
        state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))
        for _ in range(2):
            state, metrics = step(state, batch)
        assert metrics.samples_backpropagated == 2 and int(state.algorithm_state[0]) == 2
        results.append(state.params)
    for name, value in results[0].items():
        torch.testing.assert_close(results[1][name], value)
    assert all(not m._forward_hooks for m in model.modules())


def test_selective_backprop_refuses_signals_without_a_module_loss():
    def loss(params, buffers, batch):
        return (batch[0] @ params["w"]).sum(1)

    policy = make_policy(lambda: (), _largest_feature_norm, needs={"features"})
    sb = sbfunc.SelectiveBackprop(0.0, 1.0, interrupt=0, policy=policy)
    with pytest.raises(TypeError, match="needs the model"):
        sbfunc.make_train_step(loss, sbfunc.optim.sgd(0.1), [sb])


def test_signals_are_read_without_a_host_read_on_meta():
    model = mlp()
    step = _sb_step(model)
    params, buffers = to_meta(sbfunc.split_module(model, clone=True))
    state = step.init(params, buffers, key=sbfunc.random.key(0).to(META))
    batch = to_meta(batch_of(6))
    try:
        state, _ = step(state, batch)
    except (RuntimeError, NotImplementedError) as error:  # pragma: no cover - a failure report
        with host_read():
            raise error
        raise
    assert state.params["2.weight"].device == META


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 6),
    hidden=st.integers(1, 5),
    classes=st.integers(2, 4),
    seed=st.integers(0, 99),
)
def test_the_closed_form_embedding_is_the_last_layer_s_per_sample_gradient(
    n, hidden, classes, seed
):
    """<g_i, g_j> from the signals equals the inner product of the per-sample gradients of the
    cross-entropy with respect to the head's weight, from torch.func."""
    model = mlp(3, hidden, classes).double()
    g = torch.Generator().manual_seed(seed)
    batch = (torch.randn(n, 3, generator=g).double(), torch.randint(0, classes, (n,), generator=g))
    scorer = SignalScorer(sbfunc.per_sample_loss(model, F.cross_entropy), ALL)
    params, buffers = sbfunc.split_module(model)
    _, sig = score_signals(scorer, params, buffers, batch)
    gram = gradient_gram(last_layer_errors(sig.logits, sig.targets), sig.features)

    def loss(weight, x, y):
        p = {**params, "2.weight": weight}
        logits = torch.func.functional_call(model, p, (x.unsqueeze(0),))
        return F.cross_entropy(logits, y.unsqueeze(0))

    per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(
        params["2.weight"], *batch
    ).reshape(n, -1)
    torch.testing.assert_close(gram, per_sample @ per_sample.T)


def test_a_signal_policy_fills_the_refill_queue():
    model = mlp()
    batch = batch_of(4)
    sb = sbfunc.SelectiveBackprop(
        0.0, 1.0, interrupt=0, policy=sbfunc.policies.divbs(0.5), refill=batch
    )
    step = sbfunc.make_train_step(
        sbfunc.per_sample_loss(model, F.cross_entropy), sbfunc.optim.sgd(0.1), [sb]
    )
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))
    counts = []
    for seed in range(4):
        state, metrics = step(state, batch_of(4, seed=seed))
        counts.append(metrics.samples_backpropagated)
    assert counts == [0, 4, 0, 4]  # two kept rows a batch, a full batch of 4 every second step
