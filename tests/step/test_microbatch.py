"""Microbatching: the kept rows (after selection) split into chunks whose gradients add up to
the unsplit step's."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import sbfunc
from sbfunc import random as sbrandom
from sbfunc.step import Microbatching

E = sbfunc.Event


@settings(max_examples=60, derandomize=True, database=None, deadline=None)
@given(rows=st.integers(0, 40), k=st.integers(1, 9))
def test_chunk_sizes_cover_the_rows(rows, k):
    by_count, by_size = Microbatching(chunks=k).sizes(rows), Microbatching(size=k).sizes(rows)
    for sizes in (by_count, by_size):
        assert sum(sizes) == rows and all(n >= 1 for n in sizes)
        assert list(sizes) == sorted(sizes, reverse=True)  # only the last ones are smaller
    assert (
        len(by_count) == min(k, rows) and max(by_count, default=0) - min(by_count, default=0) <= 1
    )
    assert all(n == k for n in by_size[:-1]) and len(by_size) == -(-rows // k)


def _setup(bn=False):
    torch.manual_seed(0)
    layers = [nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3)]
    if bn:
        layers.insert(1, nn.BatchNorm1d(16))
    model = nn.Sequential(*layers)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(10, 6, generator=g), torch.randint(0, 3, (10,), generator=g))] * 3
    return model, data


def _weighted(scores, key, ids):
    """Keeps the 6 highest-loss rows, with weights that differ from row to row."""
    idx = torch.sort(torch.topk(scores, 6).indices).values
    return sbfunc.select.Selection(idx, torch.linspace(0.5, 1.5, 6))


def _algorithms(model, kind):
    score = sbfunc.per_sample_loss(model, F.cross_entropy)
    if kind == "none":
        return []
    if kind == "sb":
        return [
            sbfunc.SelectiveBackprop(
                0.0, 1.0, keep=0.5, interrupt=0, scoring=sbfunc.score.Scoring(loss_fn=score)
            )
        ]
    if kind == "sb-weighted":
        return [
            sbfunc.SelectiveBackprop(
                0.0,
                1.0,
                interrupt=0,
                policy=sbfunc.policies.stateless(_weighted),
                scoring=sbfunc.score.Scoring(loss_fn=score),
            )
        ]
    return [
        sbfunc.algorithms.LabelSmoothing(0.1, num_classes=3)
    ]  # BEFORE_LOSS / AFTER_LOSS per chunk


def _run(kind, bn=False, steps=3, **split):
    model, data = _setup(bn)
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    step = sbfunc.make_train_step(
        loss_fn, sbfunc.optim.adam(1e-2), _algorithms(model, kind), **split
    )
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbrandom.key(0))
    metrics = []
    for batch in data[:steps]:
        state, m = step(state, batch)
        metrics.append(m)
    return state, metrics


@pytest.mark.parametrize("kind", ["none", "sb", "sb-weighted", "smoothing"])
@pytest.mark.parametrize(
    "split",
    [
        {"microbatching": Microbatching(chunks=2)},
        {"microbatching": Microbatching(chunks=4)},
        {"microbatching": Microbatching(size=2)},
    ],
)
def test_equals_the_unsplit_step(kind, split):
    whole, wm = _run(kind)
    parts, pm = _run(kind, **split)
    for k in whole.params:
        torch.testing.assert_close(parts.params[k], whole.params[k], rtol=1e-5, atol=1e-6)
    for a, b in zip(pm, wm, strict=True):
        torch.testing.assert_close(a.loss, b.loss, rtol=1e-5, atol=1e-6)
        assert a.samples_backpropagated == b.samples_backpropagated
    assert parts.time._replace(updates_skipped=None) == whole.time._replace(updates_skipped=None)


def test_one_chunk_is_the_unsplit_step_bit_for_bit():
    whole, _ = _run("sb")
    one, _ = _run("sb", microbatching=Microbatching(size=100))
    assert all(torch.equal(one.params[k], whole.params[k]) for k in whole.params)


class Sizes(sbfunc.Algorithm):
    """Logs, per event, the rows of the batch and of the per-sample losses it sees."""

    uses_key = False

    def init(self, key):
        return ()

    def match(self, event, state):
        return event in (E.BEFORE_FORWARD, E.AFTER_FORWARD, E.AFTER_LOSS, E.AFTER_BACKWARD)

    def apply(self, event, state):
        n = sbfunc.batch.batch_size(state.batch)
        losses = None if state.losses is None else state.losses.shape[0]
        outputs = None if state.outputs is None else state.outputs.shape[0]
        return state.replace(own=(*state.own, (event.name, n, losses, outputs)))


def test_selection_comes_first_then_the_kept_rows_split():
    model, data = _setup()
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    sb = sbfunc.SelectiveBackprop(0.0, 1.0, keep=0.5, interrupt=0)
    step = sbfunc.make_train_step(
        loss_fn, sbfunc.optim.sgd(0.1), [sb, Sizes()], microbatching=Microbatching(size=2)
    )
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbrandom.key(0))
    state, metrics = step(state, data[0])
    # 10 rows, 5 kept, then chunks of 2, 2 and 1 (full chunks: the kept rows fill them)
    assert state.algorithm_state[1] == (
        ("BEFORE_FORWARD", 5, None, None),
        ("AFTER_FORWARD", 2, None, 2),
        ("AFTER_LOSS", 2, 2, 2),
        ("AFTER_FORWARD", 2, None, 2),
        ("AFTER_LOSS", 2, 2, 2),
        ("AFTER_FORWARD", 1, None, 1),
        ("AFTER_LOSS", 1, 1, 1),
        ("AFTER_BACKWARD", 5, 5, 5),  # once, on the whole kept batch
    )
    assert metrics.samples_in_batch == 10 and metrics.samples_backpropagated == 5
    assert [t.event for t in metrics.traces].count(E.AFTER_FORWARD) == 3


def test_batchnorm_statistics_update_chunk_by_chunk():
    model, data = _setup(bn=True)
    state, _ = _run("none", bn=True, steps=1, microbatching=Microbatching(chunks=2))
    assert int(state.buffers["1.num_batches_tracked"]) == 2
    bn = model[1]
    bn.train()
    x = data[0][0]
    with torch.no_grad():
        for chunk in (x[:5], x[5:]):
            bn(model[0](chunk))  # the first layer is the same: BatchNorm sees its input first
    torch.testing.assert_close(state.buffers["1.running_mean"], bn.running_mean)
    torch.testing.assert_close(state.buffers["1.running_var"], bn.running_var)


class Draw(sbfunc.Algorithm):
    """Draws one number on BEFORE_LOSS and logs it."""

    def init(self, key):
        return ()

    def match(self, event, state):
        return event == E.BEFORE_LOSS

    def apply(self, event, state):
        return state.replace(own=(*state.own, float(sbrandom.uniform(state.key, ()))))


def test_each_chunk_draws_its_own_keys_and_the_first_keeps_the_steps():
    model, data = _setup()
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    draws = []
    for split in ({}, {"microbatching": Microbatching(chunks=3)}):
        step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1), [Draw()], **split)
        state = step.init(*sbfunc.split_module(model, clone=True), key=sbrandom.key(0))
        draws.append(step(state, data[0])[0].algorithm_state[0])
    (whole,), chunks = draws
    assert len(chunks) == 3 and len(set(chunks)) == 3 and chunks[0] == whole


@pytest.mark.parametrize(
    ("split", "exc", "msg"),
    [
        (Microbatching(2, 3), ValueError, "exactly one of chunks and size"),
        (Microbatching(), ValueError, "exactly one of chunks and size"),
        (Microbatching(chunks=0), ValueError, r"Microbatching.chunks must be an int >= 1"),
        (Microbatching(size=2.0), TypeError, r"Microbatching.size must be an int >= 1"),
        (Microbatching(chunks=True), TypeError, r"Microbatching.chunks must be an int >= 1"),
        (2, TypeError, "microbatching must be an sbfunc.step.Microbatching"),
    ],
)
def test_validation(split, exc, msg):
    model, _ = _setup()
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    with pytest.raises(exc, match=msg):
        sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1), microbatching=split)


def test_the_1_1_keywords_warn_and_split_alike():
    model, _ = _setup()
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    with pytest.warns(DeprecationWarning, match=r"microbatching=sbfunc.step.Microbatching"):
        old = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1), microbatch_size=3)
    assert old.microbatching == Microbatching(size=3)
    with pytest.raises(TypeError, match="unexpected keyword arguments"):
        sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1), micro_batches=3)


def test_the_core_compiles_with_fullgraph_after_selection():
    """The only compile check here: SB keeps 5 of 10 rows, chunks of 2, 2 and 1, one graph."""
    torch._dynamo.reset()
    model, data = _setup()
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    sb = sbfunc.SelectiveBackprop(0.0, 1.0, keep=0.5, interrupt=0)
    step = sbfunc.make_train_step(
        loss_fn, sbfunc.optim.sgd(0.1), [sb], microbatching=Microbatching(size=2)
    )
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbrandom.key(0))
    plan = step.plan(state, data[0])
    core = torch.compile(step.core, fullgraph=True, backend="aot_eager")  # one graph: dynamo's
    run, out = core(plan, state, data[0])
    eager_run, eager_out = step.core(plan, state, data[0])
    assert out.samples_backpropagated == eager_out.samples_backpropagated == 5
    for k in run.context.params:
        p, q = run.context.params[k], eager_run.context.params[k]
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
