import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc import random as sbrandom

E = sbfunc.Event
EPOCH_EVENTS = (E.INIT, E.FIT_START, E.EPOCH_START, E.EPOCH_END, E.FIT_END, E.BATCH_START)


class Recorder(sbfunc.Algorithm):
    """Logs ``(event, epoch, elapsed)`` in its own state."""

    def init(self, key):
        return ()

    def match(self, event, state):
        return event in EPOCH_EVENTS

    def apply(self, event, state):
        t = state.time
        return state.replace(own=(*state.own, (event, t.epoch, t.elapsed)))


def _setup(algorithms=()):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    params, buffers = sbfunc.split_module(model, clone=True)
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1), algorithms)
    state = step.init(params, buffers, key=sbrandom.key(0))
    data = [(torch.randn(4, 3), torch.randint(0, 2, (4,))) for _ in range(3)]
    return step, state, data


def _log(state):
    ((*log,),) = state.algorithm_state
    return log


def test_epoch_events_and_elapsed():
    step, state, data = _setup([Recorder()])
    result = sbfunc.fit(step, state, data, epochs=2, progress=False)
    seen = _log(result.state)
    kinds = [e for e, _, _ in seen]
    assert kinds == [
        E.INIT, E.FIT_START,
        E.EPOCH_START, E.BATCH_START, E.BATCH_START, E.BATCH_START, E.EPOCH_END,
        E.EPOCH_START, E.BATCH_START, E.BATCH_START, E.BATCH_START, E.EPOCH_END,
        E.FIT_END,
    ]  # fmt: skip
    elapsed = [el for e, _, el in seen if e == E.BATCH_START]
    assert elapsed == [i / 6 for i in range(6)]
    assert seen[-1][2] == 1.0 and seen[-2][1] == 1  # FIT_END at 1; 2nd EPOCH_END
    t = result.state.time
    assert (t.step, t.epoch, t.batch_in_epoch) == (6, 2, 0)
    assert t.samples_forwarded == t.samples_backpropagated == 24
    assert len(result.history) == 6
    assert [m.samples_in_batch for m in result.history] == [4] * 6


def test_history_can_be_turned_off():
    step, state, data = _setup()
    result = sbfunc.fit(step, state, data, epochs=1, progress=False, history=False)
    assert result.history == [] and result.state.time.step == 3
    with pytest.raises(TypeError, match="history"):
        sbfunc.fit(step, state, data, epochs=1, progress=False, history=1)


def test_steps_duration_ends_mid_epoch():
    step, state, data = _setup([Recorder()])
    result = sbfunc.fit(step, state, data, steps=4, progress=False)
    t = result.state.time
    assert (t.step, t.epoch, t.batch_in_epoch) == (4, 1, 1)
    assert [e for e, _, _ in _log(result.state)].count(E.EPOCH_END) == 1


@settings(max_examples=15, deadline=None, derandomize=True, database=None)
@given(st.integers(1, 8))
def test_stop_and_resume_equals_one_run(stop):
    step, state, data = _setup([Recorder()])
    whole = sbfunc.fit(step, state, data, epochs=3, progress=False).state
    part = sbfunc.fit(step, state, data, epochs=3, progress=False, stop_after=stop).state
    assert part.time.step == stop and part.time.elapsed < 1.0
    done = sbfunc.fit(step, part, data, epochs=3, progress=False).state
    assert done.time._replace(updates_skipped=None) == whole.time._replace(updates_skipped=None)
    assert int(done.time.updates_skipped) == int(whole.time.updates_skipped) == 0
    assert all(torch.equal(done.params[k], whole.params[k]) for k in whole.params)
    # the resumed run fires FIT_START again, but every other event exactly once
    without_fit_start = [x for x in _log(done) if x[0] != E.FIT_START]
    assert without_fit_start == [x for x in _log(whole) if x[0] != E.FIT_START]


def test_fit_never_fires_init():
    step, state, data = _setup([Recorder()])
    assert [e for e, _, _ in _log(state)] == [E.INIT]  # step.init fired it
    part = sbfunc.fit(step, state, data, epochs=2, progress=False, stop_after=2).state
    done = sbfunc.fit(step, part, data, epochs=2, progress=False).state
    kinds = [e for e, _, _ in _log(done)]
    assert kinds.count(E.INIT) == 1 and kinds[len(_log(part)) :][:2] == [
        E.FIT_START,
        E.BATCH_START,
    ]


def test_data_as_function_of_epoch_and_progress_bar(capsys):
    step, state, _ = _setup()
    x, y = torch.randn(12, 3), torch.randint(0, 2, (12,))

    def data(epoch):
        return sbfunc.datasets.batches(x, y, 4, key=sbrandom.fold_in(sbrandom.key(1), epoch))

    result = sbfunc.fit(step, state, data, epochs=2, steps_per_epoch=3, log_every=1)
    assert result.state.time.step == 6
    assert "6/6" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("kwargs", "exc", "msg"),
    [
        ({}, ValueError, "exactly one of epochs or steps"),
        ({"epochs": 1, "steps": 1}, ValueError, "exactly one of epochs or steps"),
        ({"epochs": 0}, ValueError, "epochs must be an int >= 1"),
        ({"steps": 2.5}, TypeError, "steps must be an int >= 1"),
        ({"epochs": 1, "log_every": 0}, ValueError, "log_every"),
        ({"epochs": 1, "stop_after": 0}, ValueError, "stop_after"),
        ({"epochs": 1, "steps_per_epoch": 0}, ValueError, "steps_per_epoch must be an int >= 1"),
        ({"epochs": 1, "steps_per_epoch": 2.0}, TypeError, "steps_per_epoch must be an int"),
    ],
)
def test_validation(kwargs, exc, msg):
    step, state, data = _setup()
    with pytest.raises(exc, match=msg):
        sbfunc.fit(step, state, data, progress=False, **kwargs)


def test_unsized_data_needs_steps_per_epoch():
    step, state, data = _setup()
    with pytest.raises(ValueError, match=r"^data has no len\(\).*pass steps_per_epoch"):
        sbfunc.fit(step, state, iter(data), epochs=1, progress=False)
    with pytest.raises(ValueError, match=r"^data\(0\) has no len\(\)"):
        sbfunc.fit(step, state, lambda epoch: iter(data), epochs=1, progress=False)


def test_empty_data_is_an_error_that_names_the_argument():
    step, state, _ = _setup()
    with pytest.raises(
        ValueError, match=r"^data is empty: fit needs at least one batch per epoch"
    ):
        sbfunc.fit(step, state, [])
    with pytest.raises(ValueError, match=r"^data\(0\) is empty"):
        sbfunc.fit(step, state, lambda epoch: [], epochs=1)
    with pytest.raises(ValueError, match="no batches"):
        sbfunc.fit(step, state, [], epochs=1, steps_per_epoch=1, progress=False)


def test_a_used_up_iterator_is_named_as_the_cause():
    step, state, data = _setup()
    with pytest.raises(ValueError, match=r"epoch 1 \(data is an iterator, used up"):
        sbfunc.fit(step, state, iter(data), epochs=2, steps_per_epoch=3, progress=False)


@pytest.mark.parametrize(
    ("position", "bad", "msg"),
    [
        (0, len, "step must be a TrainStep from sbfunc.make_train_step, got builtin"),
        (1, {}, "state must be an sbfunc.TrainState .from step.init., got dict"),
        (2, None, "data must be a re-iterable of batches .* got NoneType"),
    ],
)
def test_positional_arguments_are_checked_by_name(position, bad, msg):
    args = list(_setup())
    args[position] = bad
    with pytest.raises(TypeError, match=msg):
        sbfunc.fit(*args, epochs=1, progress=False)


def _mean_loss(params, buffers, batch):
    x, y = batch
    return {"loss": F.cross_entropy(x @ params["weight"].T + params["bias"], y)}


def test_evaluation_metrics_are_numbers_and_shown_on_the_bar(capsys):
    step, state, data = _setup()
    sets = {"val": data[:1], "test": data[1:]}
    result = sbfunc.fit(
        step, state, data, epochs=2, evaluator=sbfunc.step.Evaluator(data=sets, fn=_mean_loss)
    )
    assert [e.step for e in result.evaluations] == [3, 6]
    for e in result.evaluations:
        assert {k: type(v["loss"]) for k, v in e.metrics.items()} == {"val": float, "test": float}
    last = result.evaluations[-1].metrics
    err = capsys.readouterr().err
    assert f"eval_val/loss={last['val']['loss']:.4g}" in err
    assert f"eval_test/loss={last['test']['loss']:.4g}" in err and "loss=" in err


def test_the_final_evaluation_is_shown_and_vectors_stay_off_the_bar(capsys):
    step, state, data = _setup()

    def metrics(params, buffers, batch):
        return {"acc": torch.tensor(0.25), "per_class": torch.tensor([0.5, 1.0])}

    result = sbfunc.fit(
        step, state, data, steps=2, evaluator=sbfunc.step.Evaluator(data=data[:1], fn=metrics)
    )
    (only,) = result.evaluations
    assert only.event == E.FIT_END and only.metrics == {"acc": 0.25, "per_class": [0.5, 1.0]}
    err = capsys.readouterr().err
    assert "eval_acc=0.25" in err and "per_class" not in err


def test_fit_counts_loader_batches_when_refill_skips_updates():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    params, buffers = sbfunc.split_module(model, clone=True)
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    data = [(torch.randn(4, 3), torch.randint(0, 2, (4,))) for _ in range(3)]
    policy = sbfunc.policies.top_k(0.5)
    sb = sbfunc.SelectiveBackprop(0.0, 1.0, interrupt=0, policy=policy, refill=data[0])
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1), [sb])
    state = step.init(params, buffers, key=sbrandom.key(0))
    result = sbfunc.fit(step, state, data, epochs=2, progress=False)
    t = result.state.time
    assert (t.step, t.epoch) == (6, 2)  # every loader batch counts, updated or not
    assert [m.samples_backpropagated for m in result.history] == [0, 4] * 3
    assert t.samples_backpropagated == 12 and t.samples_forwarded == 24 + 12
    assert int(t.updates_skipped) == 3  # the three steps that only queued rows


def test_a_bare_metric_is_a_number_named_eval(capsys):
    step, state, data = _setup()

    def loss(params, buffers, batch):
        return _mean_loss(params, buffers, batch)["loss"]

    result = sbfunc.fit(
        step, state, data, epochs=1, evaluator=sbfunc.step.Evaluator(data=data[:2], fn=loss)
    )
    (only,) = result.evaluations
    assert type(only.metrics) is float
    assert f"eval={only.metrics:.4g}" in capsys.readouterr().err
