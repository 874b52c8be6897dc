"""fit fires Composer's whole event sequence: loading, iterations, the data loader,
checkpoints and evaluation, in Composer's order, and resumes without losing an event."""

import re
from typing import ClassVar

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc import random as sbrandom
from sbfunc.step import Checkpointing, Evaluator
from tests.helpers import assert_identical, split

E = sbfunc.Event
SPE = 3  # batches per epoch
ROWS = 4  # rows per batch


class Recorder(sbfunc.Algorithm):
    """Logs the name of every event it sees in its own state (no fixed structure)."""

    uses_key = False

    def init(self, key):
        return ()

    def match(self, event, state):
        return True

    def apply(self, event, state):
        return state.replace(own=(*state.own, event.name))


class Tally(sbfunc.Algorithm):
    """Counts every event and hashes their order into fixed-shape tensors (checkpointable)."""

    uses_key = False
    _INDEX: ClassVar = {e: i for i, e in enumerate(E)}

    def init(self, key):
        return torch.zeros(len(E) + 1, dtype=torch.int64)

    def match(self, event, state):
        return True

    def apply(self, event, state):
        i = self._INDEX[event]
        own = state.own.clone()
        own[i] += 1
        own[-1] = (own[-1] * 48271 + i + 1) % 2147483647
        return state.replace(own=own)


def _setup(algorithms, *, microbatches=None):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    params, buffers = sbfunc.split_module(model, clone=True)
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    step = sbfunc.make_train_step(
        loss_fn, sbfunc.optim.sgd(0.1), algorithms, microbatching=split(chunks=microbatches)
    )
    state = step.init(params, buffers, key=sbrandom.key(0))
    g = torch.Generator().manual_seed(1)
    data = [
        (torch.randn(ROWS, 3, generator=g), torch.randint(0, 2, (ROWS,), generator=g))
        for _ in range(SPE)
    ]
    return step, state, data, loss_fn


def _metrics(loss_fn):
    def metrics(params, buffers, batch):
        return {"loss": loss_fn(params, buffers, batch).mean()}

    return metrics


STEP = (
    r"AFTER_DATALOADER BATCH_START BEFORE_TRAIN_BATCH BEFORE_FORWARD "
    r"(?:AFTER_FORWARD BEFORE_LOSS AFTER_LOSS BEFORE_BACKWARD )+"
    r"AFTER_BACKWARD AFTER_TRAIN_BATCH BATCH_END "
)
EVAL = (
    r"EVAL_BEFORE_ALL EVAL_START "
    r"(?:EVAL_BATCH_START EVAL_BEFORE_FORWARD EVAL_AFTER_FORWARD EVAL_BATCH_END )+"
    r"EVAL_END EVAL_AFTER_ALL "
)
BATCH = rf"BEFORE_DATALOADER {STEP}(?:{EVAL})?BATCH_CHECKPOINT "
EPOCH_CLOSED = (
    rf"EPOCH_START (?:{BATCH})+(?:BEFORE_DATALOADER )?EPOCH_END (?:{EVAL})?EPOCH_CHECKPOINT "
)
EPOCH_OPEN = rf"EPOCH_START (?:{BATCH})+"
ITERATION_CLOSED = rf"ITERATION_START (?:{EPOCH_CLOSED})+ITERATION_END ITERATION_CHECKPOINT "
ITERATION_OPEN = rf"ITERATION_START (?:{EPOCH_CLOSED})*{EPOCH_OPEN}"
COMPOSER_ORDER = re.compile(
    rf"INIT BEFORE_LOAD AFTER_LOAD FIT_START "
    rf"(?:(?:{ITERATION_CLOSED})+|(?:{ITERATION_CLOSED})*{ITERATION_OPEN})"
    rf"FIT_END (?:{EVAL})?"
)


def _log(state):
    return list(state.algorithm_state[0])


def _expected_evaluations(total, every):
    """(step, event name) of every evaluation Composer's schedule runs."""
    unit, n = ("epochs", every.epochs) if every.epochs else ("steps", every.steps)
    out = []
    for s in range(1, total + 1):
        if unit == "steps" and s % n == 0:
            out.append((s, "BATCH_END"))
        if s % SPE == 0 and unit == "epochs" and (s // SPE) % n == 0:
            out.append((s, "EPOCH_END"))
    if not out or out[-1][0] != total:
        out.append((total, "FIT_END"))
    return out


durations = st.one_of(
    st.builds(lambda e: {"epochs": e}, st.integers(1, 3)),
    st.builds(lambda s: {"steps": s}, st.integers(1, 8)),
)
intervals = st.one_of(
    st.none(),
    st.builds(lambda n: sbfunc.engine.Duration(epochs=n), st.integers(1, 2)),
    st.builds(lambda n: sbfunc.engine.Duration(steps=n), st.integers(1, 4)),
)


@settings(max_examples=15, derandomize=True, database=None, deadline=None)
@given(
    duration=durations,
    every=intervals,
    iteration_epochs=st.sampled_from([None, 1, 2]),
    microbatches=st.sampled_from([None, 2, 3]),
)
def test_the_fired_sequence_is_a_composer_order(duration, every, iteration_epochs, microbatches):
    step, state, data, loss_fn = _setup([Recorder()], microbatches=microbatches)
    default = every == sbfunc.engine.Duration(epochs=1)
    ev = Evaluator(data[:2], _metrics(loss_fn), None if default else every)
    evaluate = {} if every is None else {"evaluator": ev}
    result = sbfunc.fit(
        step,
        state,
        data,
        progress=False,
        iteration_epochs=iteration_epochs,
        **duration,
        **evaluate,
    )
    log = _log(result.state)
    assert COMPOSER_ORDER.fullmatch(" ".join(log) + " "), log
    total = duration.get("steps", duration.get("epochs", 0) * SPE)
    epochs_closed = total // SPE
    ends_on_epoch = total % SPE == 0
    assert log.count("BATCH_END") == log.count("BATCH_CHECKPOINT") == total
    assert log.count("AFTER_FORWARD") == total * min(microbatches or 1, ROWS)
    assert log.count("AFTER_BACKWARD") == total
    assert log.count("EPOCH_END") == log.count("EPOCH_CHECKPOINT") == epochs_closed
    assert log.count("EPOCH_START") == -(-total // SPE)
    # one fetch per batch, plus the fetch finding each closed epoch's data exhausted (the
    # last epoch's too, as in Composer)
    assert log.count("BEFORE_DATALOADER") == total + epochs_closed
    k = iteration_epochs or 10**9
    started = -(-total // SPE)
    assert log.count("ITERATION_START") == -(-started // k)
    closed_iterations = epochs_closed // k + (ends_on_epoch and epochs_closed % k != 0)
    assert log.count("ITERATION_END") == closed_iterations
    if every is None:
        assert result.evaluations == () and not any(x.startswith("EVAL") for x in log)
    else:
        got = [(e.step, e.event.name) for e in result.evaluations]
        assert got == _expected_evaluations(total, every)
        assert log.count("EVAL_BEFORE_ALL") == log.count("EVAL_AFTER_ALL") == len(got)
        assert log.count("EVAL_BATCH_START") == 2 * len(got)


@settings(max_examples=15, derandomize=True, database=None, deadline=None)
@given(duration=durations, stop=st.integers(1, 8), every=intervals)
def test_stopping_and_resuming_loses_no_event(duration, stop, every):
    total = duration.get("steps", duration.get("epochs", 0) * SPE)
    assume(total > 1)
    stop = min(stop, total - 1)
    step, state, data, loss_fn = _setup([Recorder()])
    ev = Evaluator(data[:1], _metrics(loss_fn), every)
    evaluate = {} if every is None else {"evaluator": ev}
    run = {"progress": False, **duration, **evaluate}
    whole = sbfunc.fit(step, state, data, **run)
    part = sbfunc.fit(step, state, data, stop_after=stop, **run)
    assert part.state.time.step == stop and "FIT_END" not in _log(part.state)
    done = sbfunc.fit(step, part.state, data, **run)
    n = len(_log(part.state))
    resumed_log = _log(done.state)
    assert resumed_log[n : n + 3] == ["BEFORE_LOAD", "AFTER_LOAD", "FIT_START"]
    del resumed_log[n : n + 3]
    assert resumed_log == _log(whole.state)
    assert_identical(done.state.params, whole.state.params)
    both = (*part.evaluations, *done.evaluations)
    assert [e[:3] for e in both] == [e[:3] for e in whole.evaluations]
    assert_identical([e.metrics for e in both], [e.metrics for e in whole.evaluations])


@pytest.mark.parametrize(
    ("save_every", "iteration_epochs", "names"),
    [
        (sbfunc.engine.Duration(steps=2), None, ["s2.pt", "s4.pt", "s6.pt", "s8.pt", "s9.pt"]),
        (None, None, ["s3.pt", "s6.pt", "s9.pt"]),
        (sbfunc.engine.Duration(epochs=2), 2, ["s6.pt", "s9.pt"]),
    ],
)
def test_checkpoints_resume_bit_for_bit(tmp_path, save_every, iteration_epochs, names):
    step, fresh, data, _ = _setup([Tally()])
    run = {"epochs": 3, "progress": False, "iteration_epochs": iteration_epochs}
    path = str(tmp_path / "s{step}.pt")
    whole = sbfunc.fit(
        step,
        fresh,
        data,
        **run,
        checkpointing=sbfunc.step.Checkpointing(save_to=path, every=save_every),
    ).state
    assert sorted(p.name for p in tmp_path.iterdir()) == names
    final = sbfunc.checkpoint.load(tmp_path / names[-1], like=fresh)
    # the last save follows the run's last checkpoint event: only FIT_END comes after it
    fit_end = list(E).index(E.FIT_END)
    counts, final_counts = whole.algorithm_state[0][:-1], final.algorithm_state[0][:-1]
    assert int(counts[fit_end]) == 1 and int(final_counts[fit_end]) == 0
    assert torch.equal(counts - final_counts, torch.eye(len(E), dtype=torch.int64)[fit_end])
    assert_identical(final.params, whole.params)
    for name in names[:-1]:
        resumed = sbfunc.fit(
            step,
            fresh,
            data,
            **run,
            checkpointing=sbfunc.step.Checkpointing(load_from=tmp_path / name),
        ).state
        ta, tb = resumed.algorithm_state[0], whole.algorithm_state[0]
        # every count equal but those of the events each call fires after loading (what
        # BEFORE_LOAD did to the template is replaced by the loaded state)
        again = [list(E).index(e) for e in (E.AFTER_LOAD, E.FIT_START)]
        same = [i for i in range(len(E)) if i not in again]
        assert torch.equal(ta[same], tb[same]) and torch.equal(ta[again], tb[again] * 2)
        assert_identical(resumed.params, whole.params)
        assert_identical(resumed.opt_state, whole.opt_state)
        assert resumed.time._replace(updates_skipped=None) == whole.time._replace(
            updates_skipped=None
        )
    assert final.time.step == 9 and final.time.epoch == 3


def test_events_see_the_time_composer_gives_them():
    seen = []

    class Clockwatch(sbfunc.Algorithm):
        uses_key = False
        events = (E.BATCH_CHECKPOINT, E.EPOCH_END, E.EPOCH_CHECKPOINT, E.EVAL_START, E.FIT_END)

        def init(self, key):
            return ()

        def match(self, event, state):
            if event in self.events:
                t = state.time
                seen.append((event.name, t.step, t.epoch, t.batch_in_epoch))
            return False

        def apply(self, event, state):
            return state  # pragma: no cover

    step, state, data, loss_fn = _setup([Clockwatch()])
    sbfunc.fit(
        step,
        state,
        data,
        steps=SPE,
        progress=False,
        evaluator=sbfunc.step.Evaluator(data=data[:1], fn=_metrics(loss_fn)),
    )
    assert seen == [
        ("BATCH_CHECKPOINT", 1, 0, 1),
        ("BATCH_CHECKPOINT", 2, 0, 2),
        ("BATCH_CHECKPOINT", 3, 0, 3),
        ("EPOCH_END", 3, 0, 3),  # the epoch that ends
        ("EVAL_START", 3, 1, 0),  # then the count advances
        ("EPOCH_CHECKPOINT", 3, 1, 0),
        ("FIT_END", 3, 1, 0),  # evaluated at the epoch's end already: not again
    ]


class Shift(sbfunc.Algorithm):
    """On evaluation events: shifts the inputs and doubles the metrics; counts evaluations."""

    uses_key = False

    def init(self, key):
        return torch.zeros((), dtype=torch.int64)

    def match(self, event, state):
        return event in (E.EVAL_BEFORE_FORWARD, E.EVAL_AFTER_FORWARD, E.EVAL_END)

    def apply(self, event, state):
        if event == E.EVAL_BEFORE_FORWARD:
            x, y = state.batch
            return state.replace(batch=(x + 1.0, y))
        if event == E.EVAL_AFTER_FORWARD:
            return state.replace(outputs={k: v * 2 for k, v in state.outputs.items()})
        return state.replace(own=state.own + 1)


def test_evaluation_metrics_are_row_weighted_and_algorithms_see_the_batch():
    step, state, data, loss_fn = _setup([Shift()])
    plain, _, _, _ = _setup([])
    eval_data = [data[0], (data[1][0][:1], data[1][1][:1])]  # 4 rows and 1 row
    result = sbfunc.fit(
        step,
        state,
        data,
        epochs=1,
        progress=False,
        evaluator=sbfunc.step.Evaluator(data=eval_data, fn=_metrics(loss_fn)),
    )
    (only,) = result.evaluations
    assert (only.step, only.epoch, only.event) == (3, 1, E.EPOCH_END)
    p, b = result.state.params, result.state.buffers
    per_row = torch.cat([loss_fn(p, b, (x + 1.0, y)) for x, y in eval_data])
    assert type(only.metrics["loss"]) is float  # read to the host once per evaluation
    assert only.metrics["loss"] == pytest.approx(float(2 * per_row.mean()), rel=1e-6)
    assert int(result.state.algorithm_state[0]) == 1  # EVAL_END's change persists
    # no algorithm: evaluate the state as it is
    _, metrics = sbfunc.step.evaluate(
        plain, result.state.replace(algorithm_state=()), eval_data, _metrics(loss_fn)
    )
    torch.testing.assert_close(
        metrics["loss"], torch.cat([loss_fn(p, b, batch) for batch in eval_data]).mean()
    )


def test_evaluation_runs_without_gradients_and_needs_batches():
    step, state, data, _ = _setup([])

    def probe(params, buffers, batch):
        return {"grad": torch.tensor(float(torch.is_grad_enabled()))}

    _, metrics = sbfunc.step.evaluate(step, state, data, probe)
    assert float(metrics["grad"]) == 0.0
    with pytest.raises(ValueError, match="eval_data yielded no batches"):
        sbfunc.step.evaluate(step, state, [], probe)


def test_the_result_unpacks_as_state_and_history():
    step, state, data, loss_fn = _setup([])
    result = sbfunc.fit(
        step,
        state,
        data,
        epochs=1,
        progress=False,
        evaluator=sbfunc.step.Evaluator(data=data[:1], fn=_metrics(loss_fn)),
    )
    final, history = result
    assert final is result.state and history is result.history and len(history) == SPE
    assert len(result.evaluations) == 1


def test_steps_duration_ending_mid_epoch_closes_neither_epoch_nor_iteration(tmp_path):
    step, state, data, _ = _setup([Recorder()])
    result = sbfunc.fit(
        step,
        state,
        data,
        steps=4,
        progress=False,
        checkpointing=sbfunc.step.Checkpointing(save_to=tmp_path / "c.pt"),
    )
    log = _log(result.state)
    assert log.count("EPOCH_END") == 1 and "ITERATION_END" not in log
    assert log[-3:] == ["BATCH_END", "BATCH_CHECKPOINT", "FIT_END"]
    saved = sbfunc.checkpoint.load(
        tmp_path / "c.pt", like=state.replace(algorithm_state=(tuple(log[:-1]),))
    )
    assert saved.time.step == 4  # the final save after the last BATCH_CHECKPOINT


@pytest.mark.parametrize(
    ("kwargs", "exc", "msg"),
    [
        ({"evaluator": Evaluator(None, len)}, ValueError, "Evaluator needs data"),
        ({"evaluator": Evaluator([()], None)}, ValueError, "Evaluator needs fn"),
        ({"evaluator": Evaluator([()], 3)}, TypeError, "Evaluator.fn must be callable"),
        ({"evaluator": Evaluator([()], len, 2)}, TypeError, "Evaluator.every must be"),
        (
            {"evaluator": Evaluator([()], len, sbfunc.engine.Duration(epochs=0))},
            ValueError,
            "Evaluator.every must give exactly one of epochs or steps",
        ),
        (
            {"checkpointing": Checkpointing(every=sbfunc.engine.Duration(steps=1))},
            ValueError,
            "Checkpointing.every needs save_to",
        ),
        ({"checkpointing": Checkpointing(3)}, TypeError, "Checkpointing.save_to must be a path"),
        (
            {"checkpointing": Checkpointing(load_from=3)},
            TypeError,
            "Checkpointing.load_from must be a path",
        ),
        ({"evaluator": ([()], len)}, TypeError, "evaluator must be an sbfunc.step.Evaluator"),
        ({"eval_data": [()], "evaluator": Evaluator([()], len)}, TypeError, "not beside it"),
        ({"eval_datum": [()]}, TypeError, "unexpected keyword arguments"),
        ({"iteration_epochs": 0}, ValueError, "iteration_epochs must be an int >= 1"),
    ],
)
def test_validation(kwargs, exc, msg):
    step, state, data, _ = _setup([])
    with pytest.raises(exc, match=msg):
        sbfunc.fit(step, state, data, epochs=1, progress=False, **kwargs)


def test_the_1_0_keywords_fold_into_the_groups_with_a_warning(tmp_path):
    step, state, data, loss_fn = _setup([])
    run = {"epochs": 1, "progress": False}
    with pytest.warns(DeprecationWarning) as caught:
        old = sbfunc.fit(step, state, data, eval_data=data[:1], eval_fn=_metrics(loss_fn), **run)
    assert [str(w.message).split(" is now")[0] for w in caught] == [
        "fit(eval_data=...)",
        "fit(eval_fn=...)",
    ]
    new = sbfunc.fit(step, state, data, evaluator=Evaluator(data[:1], _metrics(loss_fn)), **run)
    assert [e.metrics for e in old.evaluations] == [e.metrics for e in new.evaluations]
    with pytest.warns(DeprecationWarning, match=r"fit\(checkpoint=...\) is now fit\(checkpoint"):
        sbfunc.fit(step, state, data, checkpoint=tmp_path / "c.pt", **run)
    assert (tmp_path / "c.pt").exists()
