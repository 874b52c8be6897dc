import inspect

import optree
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import sbfunc
from sbfunc import random as sbrandom
from sbfunc import testing as sbst

common = settings(max_examples=30, deadline=None, derandomize=True, database=None)


def _model_state(alg=None, elapsed=0.5, batch_in_epoch=1):
    """A linear model and the event view ``alg`` sees (its own state from ``alg.init``)."""
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    params, buffers = sbfunc.split_module(model, clone=True)
    key = sbrandom.key(0)
    state = sbfunc.Context(
        key,
        params,
        buffers,
        time=sbfunc.Time(elapsed=elapsed, batch_in_epoch=batch_in_epoch),
        own=None if alg is None else alg.init(key),
    )
    return model, state


def _dict_batch(n=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "x": torch.randn(n, 4, generator=g),
        "y": torch.randint(0, 3, (n,), generator=g),
        "id": torch.arange(n) + 100,
        "meta": {"w": torch.rand(n, 2, generator=g)},
    }


def _loss(model):
    return sbfunc.per_sample_loss(model, F.cross_entropy, input="x", target="y")


@pytest.mark.parametrize(
    ("kwargs", "exc", "msg"),
    [
        ({"keep": 0.0}, ValueError, "keep"),
        ({"keep": 1.5}, ValueError, "keep"),
        ({"start": 0.8, "end": 0.2}, ValueError, "end"),
        ({"interrupt": 1}, ValueError, "interrupt"),
        ({"scale_factor": 0.0}, ValueError, "scale_factor"),
        ({"scale_factor": 2.0}, ValueError, "scale_factor"),
        ({"policy": "top_k"}, TypeError, "policy must be"),
        ({"policy": sbfunc.policies.top_k(0.5), "keep": 0.3}, ValueError, "keep=0.3 and policy="),
        # keep with a policy is refused whatever its value (0.5 too: no sentinel)
        ({"policy": sbfunc.policies.top_k(0.5), "keep": 0.5}, ValueError, "keep=0.5 and policy="),
        ({"ids": 1.5}, TypeError, "ids must be"),
        ({"scoring": {"train": True}}, TypeError, "scoring must be an sbfunc.score.Scoring"),
        ({"scoring": sbfunc.score.Scoring(train=1)}, TypeError, "scoring.train"),
        ({"scoring": sbfunc.score.Scoring(dtype=torch.int8)}, TypeError, "scoring.dtype"),
        ({"scoring": sbfunc.score.Scoring(reuse_losses=1)}, TypeError, "scoring.reuse_losses"),
        ({"scoring": sbfunc.score.Scoring(reuse_losses=True)}, ValueError, "records losses"),
        ({"scale_factor": 0.5, "scoring": sbfunc.score.Scoring(input=len)}, TypeError, "input"),
    ],
)
def test_validation_at_construction(kwargs, exc, msg):
    with pytest.raises(exc, match=msg):
        sbfunc.SelectiveBackprop(**kwargs)


@pytest.mark.parametrize("loss", [nn.Linear(4, 3), 3, F.cross_entropy])
def test_a_scoring_loss_that_is_not_a_per_sample_loss_is_refused_naming_the_fix(loss):
    with pytest.raises(TypeError, match="per_sample_loss"):
        sbfunc.SelectiveBackprop(scoring=sbfunc.score.Scoring(loss_fn=loss))


def test_composers_positional_signature_and_fewer_arguments():
    sb = sbfunc.SelectiveBackprop(0.2, 0.8, 0.25, 0.5, 3)  # Composer's order
    assert (sb.start, sb.end, sb.keep, sb.scale_factor, sb.interrupt) == (0.2, 0.8, 0.25, 0.5, 3)
    params = inspect.signature(sbfunc.SelectiveBackprop).parameters
    assert list(params)[:5] == ["start", "end", "keep", "scale_factor", "interrupt"]
    assert len(params) < 17


def test_match_decides_from_the_time_alone():
    # The reproduction: no batch in the state, a scale factor, a tuple-batch input.
    sb = sbfunc.SelectiveBackprop(scale_factor=0.5)
    state = sbfunc.Context(sbrandom.key(0), time=sbfunc.Time(elapsed=0.5))
    assert sb.match(sbfunc.Event.AFTER_DATALOADER, state) is True
    assert sb.match(sbfunc.Event.AFTER_DATALOADER, state.replace(time=sbfunc.Time())) is False


def test_unbound_without_a_loss_apply_names_both_ways():
    sb = sbfunc.SelectiveBackprop(0.0, 1.0, interrupt=0)
    _, state = _model_state(sb)
    state = state.replace(batch=(torch.randn(4, 4), torch.zeros(4, dtype=torch.long)))
    with pytest.raises(ValueError, match=r"make_train_step.*Scoring\(loss_fn="):
        sb.apply(sbfunc.Event.AFTER_DATALOADER, state)


def test_bind_gives_the_step_loss_in_eval_mode_and_the_step_spec():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Linear(4, 3))
    train = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    sb = sbfunc.SelectiveBackprop(0.0, 1.0, interrupt=0)
    bound = sb.for_step(loss_fn=train, per_sample={"w": False})
    assert sb.loss_fn is None and sb.per_sample is None  # the original is unchanged
    assert bound.loss_fn.mode == "eval" and bound.loss_fn.module is model
    assert bound.per_sample == {"w": False}
    in_train = sbfunc.SelectiveBackprop(scoring=sbfunc.score.Scoring(train=True))
    assert in_train.for_step(loss_fn=train, per_sample=None).loss_fn.mode == "train"
    own = sbfunc.per_sample_loss(model, F.cross_entropy)
    mine = sbfunc.SelectiveBackprop(scoring=sbfunc.score.Scoring(loss_fn=own))
    assert mine.for_step(loss_fn=train, per_sample=None) is mine  # nothing to change
    assert mine.for_step(loss_fn=train, per_sample=None).loss_fn.mode == "eval"
    with pytest.raises(TypeError, match="per_sample_loss"):
        sb.for_step(loss_fn=model, per_sample=None)


def test_bind_refuses_a_spec_of_its_own_that_is_not_the_steps():
    sb = sbfunc.SelectiveBackprop(per_sample={"w": False})
    assert sb.for_step(loss_fn=None, per_sample={"w": False}).per_sample == {"w": False}
    with pytest.raises(ValueError, match="prunes with per_sample"):
        sb.for_step(loss_fn=None, per_sample=None)


@common
@given(st.floats(0.0, 1.0), st.integers(0, 20), st.sampled_from([0, 2, 3]))
def test_match_follows_composer_schedule(elapsed, batch_in_epoch, interrupt):
    sb = sbfunc.SelectiveBackprop(0.2, 0.7, 0.5, interrupt=interrupt)
    _, state = _model_state(elapsed=elapsed, batch_in_epoch=batch_in_epoch)
    expected = sbfunc.selective_backprop.should_selective_backprop(
        elapsed, batch_in_epoch, 0.2, 0.7, interrupt
    )
    assert sb.match(sbfunc.Event.AFTER_DATALOADER, state) == expected
    assert not sb.match(sbfunc.Event.BEFORE_FORWARD, state)


@common
@given(sbst.pytree_batches(), st.sampled_from([0.25, 0.5, 1.0]), st.integers(0, 2**31))
def test_prunes_every_leaf_in_batch_order(batch, keep, seed):
    n = sbfunc.batch.batch_size(batch)
    scores = torch.linspace(0, 1, n)
    sb = sbfunc.SelectiveBackprop(
        0.0, 1.0, keep, interrupt=0, scoring=sbfunc.score.Scoring(loss_fn=lambda p, b, x: scores)
    )
    state = sbfunc.Context(sbrandom.key(seed), batch=batch, own=sb.init(sbrandom.key(seed)))
    out = sb.apply(sbfunc.Event.AFTER_DATALOADER, state)
    policy = sbfunc.policies.rank_power(keep)  # the default policy, drawn from its own key
    idx = policy.select(scores, policy.init(), key=state.key)[0].indices
    expected = sbfunc.batch.take(batch, idx)
    got, want = optree.tree_leaves(out.batch), optree.tree_leaves(expected)
    assert len(got) == len(want)
    assert all(
        torch.equal(a, b) if torch.is_tensor(a) else a == b for a, b in zip(got, want, strict=True)
    )
    assert out.samples_scored == n and out.sample_weights is None
    assert out.key is state.key and out.own == sbfunc.types.EmptyState()  # no key stored
    assert state.batch is batch and state.samples_scored == 0  # the input state is untouched


def test_dict_batch_with_ids_and_policy_state_round_trip():
    model, _ = _model_state()
    policy = sbfunc.policies.loshchilov(10.0, 0.5, num_ids=200)
    sb = sbfunc.SelectiveBackprop(
        0.0,
        1.0,
        interrupt=0,
        policy=policy,
        ids="id",
        scoring=sbfunc.score.Scoring(loss_fn=_loss(model)),
    )
    _, state = _model_state(sb)
    assert type(state.own) is type(policy.init())  # its own state is the policy state
    before = state.own.loss.clone()
    state = state.replace(batch=_dict_batch())
    out = sb.apply(sbfunc.Event.AFTER_DATALOADER, state)
    n_kept = sbfunc.batch.batch_size(out.batch)
    assert n_kept == 4 and set(out.batch) == {"x", "y", "id", "meta"}
    assert out.batch["meta"]["w"].shape == (4, 2)
    assert out.own is not state.own and torch.equal(state.own.loss, before)
    assert bool((out.own.epoch[100:108] == 0).all())  # every scored id recorded


def test_stale_sb_skips_scoring_of_fresh_rows():
    calls = []

    def loss_fn(params, buffers, batch):
        calls.append(batch["x"].shape[0])
        return batch["x"].sum(1)

    policy = sbfunc.policies.stale_sb(1.0, num_ids=200, max_age=2)
    sb = sbfunc.SelectiveBackprop(
        0.0, 1.0, interrupt=0, policy=policy, ids="id", scoring=sbfunc.score.Scoring(loss_fn)
    )
    _, state = _model_state(sb)
    state = sb.apply(sbfunc.Event.AFTER_DATALOADER, state.replace(batch=_dict_batch()))
    assert state.samples_scored == 8
    state = sb.apply(sbfunc.Event.AFTER_DATALOADER, state.replace(batch=_dict_batch()))
    assert calls == [8] and state.samples_scored == 8  # cached: no forward
    later = state.replace(batch=_dict_batch(), time=state.time._replace(epoch=2))
    assert sb.apply(sbfunc.Event.AFTER_DATALOADER, later).samples_scored == 16  # too old
    assert calls == [8, 8]


def test_stale_sb_needs_ids():
    policy = sbfunc.policies.stale_sb(1.0, num_ids=200)
    sb = sbfunc.SelectiveBackprop(
        0.0,
        1.0,
        interrupt=0,
        policy=policy,
        scoring=sbfunc.score.Scoring(loss_fn=lambda p, b, x: x["x"].sum(1)),
    )
    _, state = _model_state(sb)
    with pytest.raises(ValueError, match="ids"):
        sb.apply(sbfunc.Event.AFTER_DATALOADER, state.replace(batch=_dict_batch()))


def test_weights_from_policy_reach_the_step():
    model, _ = _model_state()
    loss_fn = _loss(model)
    policy = sbfunc.policies.grad_norm_importance(0.25, switch=False)
    sb = sbfunc.SelectiveBackprop(0.0, 1.0, interrupt=0, policy=policy)
    seen = []

    class Spy(sbfunc.Algorithm):
        def match(self, event, state):
            return event == sbfunc.Event.BEFORE_LOSS

        def apply(self, event, state):
            seen.append(state.sample_weights)
            return state

    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1), [sb, Spy()])
    _, view = _model_state()
    state = step.init(view.params, view.buffers, key=view.key, total_steps=64)
    state = state.replace(time=state.time._replace(elapsed=0.5))
    _, metrics = step(state, _dict_batch(16))
    kept = metrics.samples_backpropagated
    assert 1 <= kept <= 4 and seen[0].shape == (kept,)  # Horvitz-Thompson weights per kept row


def test_scores_in_eval_mode_unless_asked():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.9), nn.Linear(4, 3))
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    sb = sbfunc.SelectiveBackprop(
        0.0, 1.0, 0.5, interrupt=0, scoring=sbfunc.score.Scoring(loss_fn)
    )
    assert sb.loss_fn.mode == "eval" and loss_fn.mode == "train"
    composer_like = sbfunc.SelectiveBackprop(scoring=sbfunc.score.Scoring(loss_fn, train=True))
    assert composer_like.loss_fn.mode == "train"


def test_repr_names_the_configuration():
    sb = sbfunc.SelectiveBackprop()
    assert repr(sb) == (
        "SelectiveBackprop(start=0.5, end=0.9, keep=0.5, scale_factor=1.0, interrupt=2)"
    )
    assert "policy=Policy(" in repr(sbfunc.SelectiveBackprop(policy=sbfunc.policies.top_k(0.5)))


def _refill_run(policy, steps=6, n=8):
    """SB with refill on batches of n rows with ids; returns the step metrics and the ids of
    the rows each update trained on."""
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    params, buffers = sbfunc.split_module(model, clone=True)
    trained = []

    class Spy(sbfunc.Algorithm):
        def match(self, event, state):
            return event == sbfunc.Event.BEFORE_LOSS

        def apply(self, event, state):
            trained.append(state.batch["id"].tolist())
            return state

    loss_fn = _loss(model)
    sb = sbfunc.SelectiveBackprop(
        0.0, 1.0, interrupt=0, policy=policy, ids="id", refill=_dict_batch(n)
    )
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1), [sb, Spy()])
    state = step.init(params, buffers, key=sbrandom.key(3), total_steps=64)
    history = []
    for i in range(steps):
        batch = _dict_batch(n, seed=i)
        batch["id"] = torch.arange(n) + n * i
        state, metrics = step(state, batch)
        history.append(metrics)
    return state, history, trained


def test_refill_trains_on_full_batches_in_arrival_order():
    state, history, trained = _refill_run(sbfunc.policies.top_k(0.5))
    # top-k keeps 4 of 8 rows: every other step has a full batch of 8 queued rows.
    assert [m.samples_backpropagated for m in history] == [0, 8, 0, 8, 0, 8]
    assert all(torch.isnan(m.loss) for m in history[::2])
    assert state.time.step == 6 and state.time.samples_backpropagated == 24
    flat = [i for ids in trained for i in ids]
    assert len(flat) == len(set(flat)) == 24  # never dropped or duplicated
    assert [i // 8 for i in flat] == sorted(i // 8 for i in flat)  # FIFO across batches
    _, queue = state.algorithm_state[0]
    assert sbfunc.batch.batch_size(queue.rows) == 0
    assert [bool(m.skipped) for m in history] == [True, False] * 3
    assert int(state.time.updates_skipped) == 3  # a step with no rows makes no update


def test_refill_with_variable_count_policy_keeps_every_selected_row():
    state, history, trained = _refill_run(sbfunc.policies.jiang_cdf(1.0), steps=10)
    _, queue = state.algorithm_state[0]
    backpropagated = sum(m.samples_backpropagated for m in history)
    assert all(m.samples_backpropagated in (0, 8) for m in history)
    assert backpropagated == 8 * len(trained)
    flat = [i for ids in trained for i in ids] + queue.rows["id"].tolist()
    assert len(flat) == len(set(flat))  # every kept row once: trained or still queued


def test_refill_state_checkpoints(tmp_path):
    state, _, _ = _refill_run(sbfunc.policies.top_k(0.5), steps=3)
    _, queue = state.algorithm_state[0]
    assert sbfunc.batch.batch_size(queue.rows) == 4  # mid-refill
    sbfunc.checkpoint.save(state, tmp_path / "s.pt")
    fresh, _, _ = _refill_run(sbfunc.policies.top_k(0.5), steps=0)
    loaded = sbfunc.checkpoint.load(tmp_path / "s.pt", like=fresh)
    assert torch.equal(loaded.algorithm_state[0][1].rows["x"], queue.rows["x"])


def test_refill_refuses_weighted_selections():
    with pytest.raises(ValueError, match="refill cannot queue weighted selections"):
        _refill_run(sbfunc.policies.jiang_cdf(1.0, reweight=True), steps=1)


@pytest.mark.parametrize("make", [sbfunc.policies.top_k, sbfunc.policies.rank_power])
def test_refill_never_queues_a_row_with_a_non_finite_score(make):
    def score(params, buffers, batch):  # ids 0, 3, 6 cannot be scored
        return torch.where(batch["id"] % 3 == 0, torch.nan, batch["x"].sum(1))

    example = _dict_batch(8)
    sb = sbfunc.SelectiveBackprop(
        0.0, 1.0, interrupt=0, policy=make(0.75), refill=example,
        scoring=sbfunc.score.Scoring(loss_fn=score),
    )  # fmt: skip
    _, state = _model_state(sb)
    batch = dict(example, id=torch.arange(8))
    out = sb.apply(sbfunc.Event.AFTER_DATALOADER, state.replace(batch=batch))
    _, queue = out.own
    assert queue.rows["id"].tolist() == [1, 2, 4, 5, 7]  # 6 kept, the forced NaN row dropped
    assert sbfunc.batch.batch_size(out.batch) == 0


def _kept_ids(extra_before=(), extra_after=(), steps=4):
    """The ids Selective Backprop keeps on each of ``steps`` steps of a run whose algorithm
    list is ``[*extra_before, SB, *extra_after]`` (scores depend on the data only)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    params, buffers = sbfunc.split_module(model, clone=True)
    kept = []

    rank_power = sbfunc.policies.rank_power(0.25)

    def select(scores, key, ids):
        sel, _ = rank_power.select(scores, rank_power.init(), key=key)
        kept.append(sel.indices.tolist())
        return sel

    sb = sbfunc.SelectiveBackprop(
        0.0,
        1.0,
        interrupt=0,
        policy=sbfunc.policies.stateless(select),
        scoring=sbfunc.score.Scoring(loss_fn=lambda p, b, batch: batch["x"].flatten(1).sum(1)),
    )
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, input="x", target="y")
    step = sbfunc.make_train_step(
        loss_fn, sbfunc.optim.sgd(0.1), [*extra_before, sb, *extra_after]
    )
    state = step.init(params, buffers, key=sbrandom.key(11), total_steps=64)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        batch = {
            "x": torch.rand(16, 1, 4, 4, generator=g) + 1,
            "y": torch.randint(0, 3, (16,), generator=g),
        }
        state, _ = step(state, batch)
    return kept


def test_other_algorithms_never_change_selective_backprops_draws():
    alone = _kept_ids()
    assert len(alone) == 4 and len({tuple(k) for k in alone}) > 1  # a new draw every step
    mixup = sbfunc.algorithms.MixUp(alpha=1.0, num_classes=3, input="x", target="y")
    assert _kept_ids(extra_before=[mixup]) == alone
    assert _kept_ids(extra_after=[sbfunc.algorithms.CutOut(input="x")]) == alone
    second = sbfunc.SelectiveBackprop(
        0.0,
        1.0,
        0.5,
        interrupt=0,
        name="other",
        scoring=sbfunc.score.Scoring(loss_fn=lambda p, b, x: x["x"].sum((1, 2, 3))),
    )  # selectors run in list order on every event: listed after SB, it prunes SB's rows
    assert _kept_ids(extra_after=[second]) == alone


def test_outside_its_window_the_step_is_plain():
    model, view = _model_state()
    loss_fn = _loss(model)
    sb = sbfunc.SelectiveBackprop(0.5, 0.9, 0.25, interrupt=0)
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1), [sb])
    plain = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1))
    state = step.init(view.params, view.buffers, key=view.key, total_steps=64)
    batch = _dict_batch(16)
    early, m_early = step(state, batch)
    expected, _ = plain(plain.init(view.params, view.buffers, key=view.key, total_steps=64), batch)
    assert m_early.samples_backpropagated == 16 and m_early.traces == ()
    assert all(torch.equal(early.params[k], expected.params[k]) for k in expected.params)
    inside = state.replace(time=state.time._replace(elapsed=0.6))
    _, m_inside = step(inside, batch)
    assert m_inside.samples_backpropagated == 4
    assert [(t.name, t.event) for t in m_inside.traces] == [
        ("SelectiveBackprop", sbfunc.Event.AFTER_DATALOADER)
    ]


@pytest.mark.parametrize(
    "make",
    [
        lambda: sbfunc.policies.stale_sb(1.0, num_ids=200, max_age=2),
        lambda: sbfunc.policies.infobatch(0.5, 0.9, num_ids=200),
        lambda: sbfunc.policies.loshchilov(10.0, 0.5, num_ids=200),
        lambda: sbfunc.policies.grad_norm_importance(0.5),
    ],
)
def test_policies_run_inside_the_step_on_the_clock(make):
    """Inside the step the epoch and elapsed time reach the policy as clock tensors."""
    model, view = _model_state()
    loss_fn = _loss(model)
    sb = sbfunc.SelectiveBackprop(0.0, 1.0, interrupt=0, policy=make(), ids="id")
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1), [sb])
    state = step.init(view.params, view.buffers, key=view.key, total_steps=64)
    for epoch in range(3):
        state = state.replace(time=state.time._replace(epoch=epoch, elapsed=epoch / 3))
        state, metrics = step(state, _dict_batch(8))
        assert 1 <= metrics.samples_backpropagated <= 8 and not bool(metrics.skipped)
    assert type(state.algorithm_state[0]) is type(make().init())
