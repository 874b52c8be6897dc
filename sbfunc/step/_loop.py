"""The loop helper: Composer's whole event sequence around the step, evaluation,
checkpoints, elapsed time, progress and sample accounting."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sized
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from sbfunc.engine import Duration, Event, TrainState
from sbfunc.step._evaluation import EvalFn, Evaluation
from sbfunc.step._fit_options import Checkpointing, Evaluator, grouped_options
from sbfunc.step._records import StepMetrics
from sbfunc.step._sequence import Data, Loop, epoch_batches, load_into, step_fields
from sbfunc.step._train_step import TrainStep
from sbfunc.validation import check_int

__all__ = ["FitResult", "fit"]


@dataclass(frozen=True)
class FitResult:
    """What :func:`fit` returns; unpacks as ``state, history`` (``evaluations`` by name).

    Attributes:
        state: the final train state.
        history: one :class:`StepMetrics` per step run by this call (empty with
            ``fit(..., history=False)``).
        evaluations: one :class:`~sbfunc.step.Evaluation` per evaluation run by this call, in
            order (empty without ``eval_data``); their metrics are Python numbers.

    Example:
        >>> state = sbfunc.TrainState({}, {}, sbfunc.random.key(0))
        >>> result = sbfunc.step.FitResult(state, [])
        >>> final, history = result
        >>> history, result.evaluations
        ([], ())

    References:
        MosaicML Composer ``Trainer.fit`` and ``Trainer.eval``.
    """

    state: TrainState
    history: list[StepMetrics]
    evaluations: tuple[Evaluation, ...] = ()

    def __iter__(self) -> Iterator[Any]:
        """``state, history = fit(...)``, as when the result was a pair."""
        return iter((self.state, self.history))


def _interval(value: Duration | None, name: str) -> tuple[str, int] | None:
    """``("epochs" | "steps", n)`` from a :class:`Duration` argument, or ``None``."""
    if value is None:
        return None
    if not isinstance(value, Duration):
        raise TypeError(f"{name} must be an sbfunc.engine.Duration or None, got {value!r}")
    unit, n = ("epochs", value.epochs) if value.epochs is not None else ("steps", value.steps)
    if (value.epochs is None) == (value.steps is None) or (
        isinstance(n, bool) or not isinstance(n, int) or n < 1
    ):
        raise ValueError(
            f"{name} must give exactly one of epochs or steps, an int >= 1; got {value!r}"
        )
    return unit, n


def _positive(value: int | None, name: str) -> int | None:
    return None if value is None else check_int(value, name, low=1, fix="or None")


def fit(
    step: TrainStep,
    state: TrainState,
    data: Data,
    *,
    epochs: int | None = None,
    steps: int | None = None,
    steps_per_epoch: int | None = None,
    progress: bool = True,
    log_every: int = 10,
    stop_after: int | None = None,
    history: bool = True,
    iteration_epochs: int | None = None,
    evaluator: Evaluator | None = None,
    checkpointing: Checkpointing | None = None,
    **legacy: Any,
) -> FitResult:
    r"""Run a training loop around a :class:`TrainStep`, firing Composer's whole event sequence.

    The events, in Composer's order (``INIT`` fires in ``step.init``)::

        BEFORE_LOAD, AFTER_LOAD (around loading load_from), FIT_START
        per iteration: ITERATION_START
          per epoch: EPOCH_START
            per batch: BEFORE_DATALOADER, the step (AFTER_DATALOADER ... BATCH_END),
                       [evaluation], BATCH_CHECKPOINT
            BEFORE_DATALOADER (the fetch that finds the epoch's data exhausted)
            EPOCH_END, [evaluation], EPOCH_CHECKPOINT
          ITERATION_END, ITERATION_CHECKPOINT
        FIT_END, [evaluation]
        evaluation: EVAL_BEFORE_ALL, per evaluation set: EVAL_START, per batch
          (EVAL_BATCH_START, EVAL_BEFORE_FORWARD, EVAL_AFTER_FORWARD, EVAL_BATCH_END),
          EVAL_END; then EVAL_AFTER_ALL

    Every call fires ``BEFORE_LOAD`` and ``AFTER_LOAD`` (a call is Composer's ``Trainer``
    construction plus ``fit``), around loading ``checkpointing.load_from`` into the shape of
    ``state`` when given. An iteration spans ``iteration_epochs`` epochs, or the whole run by
    default; the run's end also ends the last iteration (Composer never ends an iteration without a
    configured length). A run that ends mid-epoch (a duration in steps) ends neither the epoch
    nor the iteration and fetches no further batch, as in Composer; a run that ends with an
    epoch still makes the fetch that finds that epoch's data exhausted.

    ``fit`` sets ``time.total_steps`` to the run's length, so every step advances
    ``time.elapsed`` to ``steps_done / total_steps`` (a fraction in [0, 1]); when an epoch
    ends ``EPOCH_END`` fires, then ``time.epoch`` is incremented and
    ``time.batch_in_epoch`` reset. A state loaded from a checkpoint resumes where it stopped:
    finished epochs and the batches already seen in the current one are skipped (without
    events), so a resumed run fires the same events and ends in the same state as an
    uninterrupted one when ``data`` is deterministic (only ``BEFORE_LOAD``, ``AFTER_LOAD``
    and ``FIT_START`` fire again).

    **Evaluation** (with ``evaluator=``\ :class:`Evaluator`\ ``(data, fn, every)``):
    ``fn(params, buffers, batch)`` returns a pytree of
    per-batch means; it runs under ``torch.no_grad()`` and must evaluate purely, in eval mode:
    build it on :func:`sbfunc.module.eval_outputs` or :func:`sbfunc.predict` (eval mode on
    copies of the buffers, so BatchNorm statistics never change). It runs after ``BATCH_END`` every
    ``every.steps`` steps or after ``EPOCH_END`` every ``every.epochs`` epochs
    (default: every epoch), and after ``FIT_END`` unless the schedule just evaluated the final
    state (Composer's default ``eval_interval`` and end-of-training evaluation). See
    :func:`sbfunc.step.evaluate` for the events and the averaging. Each evaluation's metrics
    are read to the host once (Python numbers in :attr:`FitResult.evaluations`, ``tolist``
    of every tensor; evaluation is not the step's hot path) and the latest scalar ones are
    shown on the progress bar (``eval_<name>``).

    **Checkpoints** (with ``checkpointing=``\ :class:`Checkpointing`\ ``(save_to, every,
    load_from)``): the state is saved atomically with
    :func:`sbfunc.checkpoint.save` after ``BATCH_CHECKPOINT`` every ``every.steps`` steps,
    or every ``every.epochs`` epochs (default: every epoch) after ``EPOCH_CHECKPOINT``
    (after ``ITERATION_CHECKPOINT`` when the iteration ends with the epoch, so a resumed run
    misses no event), and once more after the run's last checkpoint event. ``save_to`` is
    formatted with ``step`` and ``epoch`` (``"ckpt/step{step}.pt"``; without fields each save
    replaces the last); its folder is created. Pass a saved file as ``load_from`` (or
    :func:`sbfunc.checkpoint.load` it) to resume.

    Selective methods change what progress means, so the progress bar and ``state.time``
    report forward samples (scoring + training forwards) and backpropagated samples separately.
    Reading the loss for the bar is a host sync; it happens every ``log_every`` steps and at
    the end only, and never with ``progress=False``. Rows left out of updates because their
    input or loss was not finite are counted in ``time.rows_nonfinite``; ``fit`` reads that
    count where it reads metrics anyway (at the bar's updates and once at the end of the call)
    and warns once (:class:`sbfunc.step.NonFiniteRowsWarning`) when it grew.

    Args:
        step: from :func:`sbfunc.make_train_step` (or ``torch.compile`` of one).
        state: initial (or resumed) state; with ``load_from``, the template it loads into
            (e.g. a fresh ``step.init(...)``).
        data: a re-iterable of batches with ``len`` (a list, a DataLoader) or a function
            ``epoch -> iterable`` (for per-epoch shuffling from a key).
        epochs: duration in epochs; or
        steps: duration in steps.
        steps_per_epoch: batches per epoch when ``data`` has no ``len`` (at most this many are
            taken from each epoch's data).
        progress: show a tqdm progress bar: the loss (every ``log_every`` steps), the sample
            counts and the latest evaluation metrics.
        log_every: steps between progress-bar loss updates.
        stop_after: return once ``time.step`` reaches this value (after that step's
            ``BATCH_CHECKPOINT``, or after the epoch's end when that step ends it; the data is
            not fetched further), before the end of the duration (a preemption point):
            ``FIT_END`` does not fire and the returned state, saved with
            :mod:`sbfunc.checkpoint` and passed to ``fit`` again with the same duration,
            continues exactly as if never stopped.
        history: keep every step's :class:`StepMetrics` (their loss tensors stay alive);
            ``False`` keeps none.
        iteration_epochs: epochs per iteration (``None``: one iteration, the whole run).
        evaluator: what to evaluate and how often (:class:`Evaluator`), or ``None``.
        checkpointing: where to save and what to resume from (:class:`Checkpointing`), or
            ``None``.
        **legacy: 1.0's ``eval_data``, ``eval_fn``, ``eval_every``, ``checkpoint``,
            ``save_every`` and ``load_from``, folded into the groups with a
            ``DeprecationWarning`` (removed in 1.3).

    Returns:
        A :class:`FitResult`.

    Raises:
        ValueError: for a duration, interval or count out of range, an :class:`Evaluator`
            without ``data`` or ``fn``, a :class:`Checkpointing` ``every`` without
            ``save_to``, empty ``data``, data without ``len`` and no ``steps_per_epoch``, or
            data that yields no batch in an epoch.
        TypeError: for arguments of the wrong type (``step`` not a :class:`TrainStep`,
            ``state`` not a :class:`~sbfunc.TrainState`, ``data`` neither iterable nor
            callable, ...).

    Example:
        >>> model = torch.nn.Linear(2, 2)
        >>> loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy)
        >>> step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1))
        >>> state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))
        >>> data = [(torch.randn(4, 2), torch.randint(0, 2, (4,))) for _ in range(3)]
        >>> result = sbfunc.fit(step, state, data, epochs=2, progress=False)
        >>> result.state.time.step, result.state.time.epoch, result.state.time.elapsed
        (6, 2, 1.0)

        Evaluation every epoch, and a checkpoint every 4 steps:

        >>> def metrics(params, buffers, batch):
        ...     out = sbfunc.module.eval_outputs(loss_fn, params, buffers, batch)
        ...     return {"loss": out.losses.mean()}
        >>> import tempfile, os
        >>> folder = tempfile.mkdtemp()
        >>> result = sbfunc.fit(
        ...     step, state, data, epochs=2, progress=False,
        ...     evaluator=sbfunc.step.Evaluator(data[:1], metrics),
        ...     checkpointing=sbfunc.step.Checkpointing(
        ...         os.path.join(folder, "s{step}.pt"), every=sbfunc.engine.Duration(steps=4)))
        >>> [(e.step, e.event.name) for e in result.evaluations]
        [(3, 'EPOCH_END'), (6, 'EPOCH_END')]
        >>> type(result.evaluations[-1].metrics["loss"])  # read to the host, once per evaluation
        <class 'float'>
        >>> sorted(os.listdir(folder))
        ['s4.pt', 's6.pt']

    References:
        MosaicML Composer ``Trainer.fit`` (its event order, ``eval_interval``,
        ``save_interval`` and iterations) and ``Time``.
    """
    evaluator, checkpointing = grouped_options(evaluator, checkpointing, legacy)
    _check_inputs(step, state, data)
    spe = _steps_per_epoch(data, steps_per_epoch)
    total = Duration(epochs, steps).total_steps(spe)
    options = _loop_options(total, log_every, stop_after, history, iteration_epochs)
    options.update(eval_on=_eval_config(evaluator), save_on=_save_config(checkpointing))
    state = _started(step, state, total, _load_from(checkpointing))
    bar = tqdm(total=total, initial=state.time.step, disable=not progress, unit="step")
    log = log_every if progress else None
    loop = Loop(step, data, spe, total, bar=bar, log_every=log, **options)
    try:
        state = _run(loop, state)
    finally:
        bar.close()
    return FitResult(state, loop.kept, tuple(loop.evaluations))


def _loop_options(
    total: int, log_every: int, stop_after: int | None, history: bool, iteration: int | None
) -> dict[str, Any]:
    """``fit``'s loop settings, checked: its step limit, ``history``, ``iteration_epochs``."""
    check_int(log_every, "log_every", low=1)
    if not isinstance(history, bool):
        raise TypeError(f"history must be True or False, got {history!r}")
    limit = min(total, _positive(stop_after, "stop_after") or total)
    iteration = _positive(iteration, "iteration_epochs")
    return {"limit": limit, "history": history, "iteration_epochs": iteration}


def _load_from(checkpointing: Checkpointing) -> str | os.PathLike[str] | None:
    load_from = checkpointing.load_from
    if load_from is not None and not isinstance(load_from, str | os.PathLike):
        raise TypeError(
            f"Checkpointing.load_from must be a path or None, got {type(load_from).__name__}"
        )
    return load_from


def _started(
    step: TrainStep, state: TrainState, total: int, load_from: str | os.PathLike[str] | None
) -> TrainState:
    """The state the loop starts from: the run's length set, ``load_from`` loaded into it
    (``BEFORE_LOAD``/``AFTER_LOAD``), ``elapsed`` from its step, then ``FIT_START``."""
    state = state.replace(time=state.time._replace(total_steps=total))  # loads into it too
    state = load_into(step, state, load_from)
    t = state.time
    state = state.replace(time=t._replace(total_steps=total, elapsed=min(t.step / total, 1.0)))
    return step.run_event(Event.FIT_START, state)[0]


def _check_inputs(step: TrainStep, state: TrainState, data: Data) -> None:
    """The positional arguments' types, named as ``fit`` names them."""
    if not callable(step) or not hasattr(step, "run_event"):
        raise TypeError(
            f"step must be a TrainStep from sbfunc.make_train_step, got {type(step).__name__}"
        )
    if not isinstance(state, TrainState):
        raise TypeError(
            f"state must be an sbfunc.TrainState (from step.init), got {type(state).__name__}"
        )
    if not (callable(data) or isinstance(data, Iterable)):
        raise TypeError(
            "data must be a re-iterable of batches (a list, a DataLoader) or a function "
            f"epoch -> iterable, got {type(data).__name__}"
        )


def _steps_per_epoch(data: Data, given: int | None) -> int:
    """``steps_per_epoch`` as given, else the length of epoch 0's data; errors name what the
    user passed (``data``, or ``steps_per_epoch``)."""
    if given is not None:
        return check_int(given, "steps_per_epoch", low=1, fix="leave it out to count len(data)")
    probe = epoch_batches(data, 0)
    what = "data(0)" if callable(data) else "data"
    if not isinstance(probe, Sized):
        raise ValueError(
            f"{what} has no len(), so fit cannot count the batches of an epoch; "
            "pass steps_per_epoch"
        )
    if len(probe) == 0:
        raise ValueError(f"{what} is empty: fit needs at least one batch per epoch")
    return len(probe)


def _run(loop: Loop, state: TrainState) -> TrainState:
    """The loop, the final numbers on the progress bar and, when the run is done (not stopped
    by ``stop_after``), ``FIT_END`` and the final evaluation."""
    loop.check_rows(state)  # the count when the call starts, kept on the device (no read)
    state = loop.run(state)
    loop.check_rows(state)
    every = loop.log_every
    if every is not None and loop.last is not None and state.time.step % every != 0:
        loop.show(step=step_fields(state, loop.last))  # not those of the last refresh
    if state.time.step < loop.total:  # stopped early: resume later with fit(...) again
        return state
    state = state.replace(time=state.time._replace(elapsed=1.0))
    state = loop.fire(Event.FIT_END, state)
    if loop.eval_on is not None and not loop.evaluated_at_end(state):
        state = loop.evaluate(state, Event.FIT_END)
    return state


def _eval_config(evaluator: Evaluator | None) -> tuple[Any, EvalFn, tuple[str, int]] | None:
    if evaluator is None:
        return None
    data, eval_fn, every = evaluator
    if data is None:
        raise ValueError("Evaluator needs data: the evaluation batches, got None")
    if eval_fn is None:
        raise ValueError("Evaluator needs fn(params, buffers, batch) -> metrics, got None")
    if not callable(eval_fn):
        raise TypeError(f"Evaluator.fn must be callable, got {type(eval_fn).__name__}")
    interval = _interval(Duration(epochs=1) if every is None else every, "Evaluator.every")
    assert interval is not None
    return data, eval_fn, interval


def _save_config(checkpointing: Checkpointing) -> tuple[str, tuple[str, int]] | None:
    path, every = checkpointing.save_to, checkpointing.every
    if path is None:
        if every is not None:
            raise ValueError("Checkpointing.every needs save_to=path")
        return None
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"Checkpointing.save_to must be a path or None, got {type(path).__name__}")
    interval = _interval(Duration(epochs=1) if every is None else every, "Checkpointing.every")
    assert interval is not None
    return os.fspath(path), interval
