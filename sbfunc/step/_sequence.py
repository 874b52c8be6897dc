"""Composer's event sequence over iterations, epochs and batches, for :func:`sbfunc.fit`."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import optree
import torch

from sbfunc import checkpoint as ckpt
from sbfunc.engine import Event, TrainState
from sbfunc.step._evaluation import EvalFn, Evaluation, evaluate
from sbfunc.step._records import StepMetrics
from sbfunc.step._train_step import TrainStep

__all__ = [
    "Data",
    "Loop",
    "NonFiniteRowsWarning",
    "SkippedUpdatesWarning",
    "epoch_batches",
    "eval_fields",
    "host_metrics",
    "load_into",
    "step_fields",
]

Data = Iterable[Any] | Callable[[int], Iterable[Any]]
"""Training data: a re-iterable of batches or a function ``epoch -> iterable``."""


def epoch_batches(data: Data, epoch: int) -> Iterable[Any]:
    """The batches of ``epoch``: ``data(epoch)`` for a function, else ``data`` itself."""
    return data(epoch) if callable(data) else data


_END = object()  # the data ran out


class NonFiniteRowsWarning(UserWarning):
    """:func:`sbfunc.fit` left training rows out of their updates (a non-finite input or loss,
    no real target token, an empty attention mask); the other rows of those batches trained.

    Example:
        >>> issubclass(sbfunc.step.NonFiniteRowsWarning, UserWarning)
        True
    """


class SkippedUpdatesWarning(UserWarning):
    """:func:`sbfunc.fit` skipped whole updates: their loss or a gradient was not finite, or
    no row was left to train on; the parameters did not change on those steps.

    Example:
        >>> issubclass(sbfunc.step.SkippedUpdatesWarning, UserWarning)
        True
    """


class Loop:
    """One call's loop: configuration, the progress bar and what the call collects."""

    def __init__(
        self,
        step: TrainStep,
        data: Data,
        steps_per_epoch: int,
        total: int,
        limit: int,
        *,
        eval_on: tuple[Any, EvalFn, tuple[str, int]] | None,
        save_on: tuple[str, tuple[str, int]] | None,
        iteration_epochs: int | None,
        history: bool,
        bar: Any,
        log_every: int | None,
    ) -> None:
        self.step, self.data, self.spe = step, data, steps_per_epoch
        self.total, self.limit = total, limit
        self.eval_on, self.save_on = eval_on, save_on
        self.iteration_epochs = iteration_epochs
        self.history, self.bar, self.log_every = history, bar, log_every
        self.kept: list[StepMetrics] = []
        self.evaluations: list[Evaluation] = []
        self.last: StepMetrics | None = None
        self.seen: tuple[torch.Tensor | None, torch.Tensor | None] | None = None  # counts
        self.warned: set[type[Warning]] = set()
        self.shown: tuple[dict[str, Any], dict[str, str]] = ({}, {})  # step, eval fields

    def check_rows(self, state: TrainState) -> None:
        """Warn once per call and kind when rows were left out of their updates, or whole
        updates skipped, since the last check. The first check of a call keeps the counts on
        the device; each later one reads how much they grew (a host sync): only where the loop
        reads metrics anyway."""
        t = state.time
        seen, self.seen = self.seen, (t.rows_nonfinite, t.updates_skipped)
        if seen is None:
            return
        rows, skipped = (_grew(now, then) for now, then in zip(self.seen, seen, strict=True))
        if rows:
            self._warn(
                NonFiniteRowsWarning,
                f"{rows} training rows by step {t.step} had a non-finite input or loss, no real "
                "target token or an empty attention mask: each was left out of its update and "
                "the other rows of its batch trained (state.time.rows_nonfinite counts them); "
                "check the data, or pass nonfinite='raise' to make_train_step to stop at the "
                "first one",
            )
        if skipped:
            self._warn(
                SkippedUpdatesWarning,
                f"{skipped} updates by step {t.step} were skipped: their loss or a gradient was "
                "not finite, or no row was left to train on, so the parameters did not change "
                "on those steps (state.time.updates_skipped counts them; the progress bar shows "
                "the count as 'skipped')",
            )

    def _warn(self, kind: type[Warning], message: str) -> None:
        if kind not in self.warned:
            self.warned.add(kind)
            warnings.warn(message, kind, stacklevel=5)

    def fire(self, event: Event, state: TrainState) -> TrainState:
        """``event`` through the step's algorithms and passes."""
        return self.step.run_event(event, state)[0]

    def run(self, state: TrainState) -> TrainState:
        """Epochs until ``time.step`` reaches the limit."""
        while True:
            t = state.time
            if t.step >= self.limit:
                if t.batch_in_epoch >= self.spe:  # the last batch also ended the epoch:
                    # the fetch that finds the epoch's data exhausted (Composer fires it too)
                    state = self.fire(Event.BEFORE_DATALOADER, state)
                    state = self.close_epoch(state)
                return state
            if t.batch_in_epoch == 0:  # a resumed state is mid-epoch: its START events fired
                k = self.iteration_epochs
                if (t.epoch == 0) if k is None else (t.epoch % k == 0):
                    state = self.fire(Event.ITERATION_START, state)
                state = self.fire(Event.EPOCH_START, state)
            state, ended = self.run_epoch(state)
            if ended:
                state = self.close_epoch(state)

    def run_epoch(self, state: TrainState) -> tuple[TrainState, bool]:
        """The epoch's batches until the data or ``steps_per_epoch`` ends it (``True``) or the
        limit is reached (``False``); resumed epochs skip the batches already seen."""
        skip = state.time.batch_in_epoch
        batches: Iterator[Any] | None = None
        while state.time.step < self.limit:
            state = self.fire(Event.BEFORE_DATALOADER, state)
            if state.time.batch_in_epoch >= self.spe:
                return state, True
            if batches is None:
                batches = iter(epoch_batches(self.data, state.time.epoch))
                for _ in range(skip):
                    next(batches, _END)
            batch = next(batches, _END)
            if batch is _END:
                if state.time.batch_in_epoch == 0:
                    raise ValueError(_no_batches(self.data, state.time.epoch))
                return state, True
            state = self.train(state, batch)
        return state, False

    def train(self, state: TrainState, batch: Any) -> TrainState:
        """One step, then evaluation and ``BATCH_CHECKPOINT`` when due."""
        state, self.last = self.step(state, batch)
        if self.history:
            self.kept.append(self.last)
        self.bar.update(1)
        t = state.time
        if self.log_every is not None and t.step % self.log_every == 0:
            self.show(step=step_fields(state, self.last))
            self.check_rows(state)
        if self.eval_on is not None and _due(self.eval_on[2], "steps", t.step):
            state = self.evaluate(state, Event.BATCH_END)
        state = self.fire(Event.BATCH_CHECKPOINT, state)
        final = t.step >= self.total and t.batch_in_epoch < self.spe  # the epoch stays open
        if self.save_on is not None and (final or _due(self.save_on[1], "steps", t.step)):
            _save(state, self.save_on[0])
        return state

    def close_epoch(self, state: TrainState) -> TrainState:
        """``EPOCH_END``, the epoch count, evaluation, ``EPOCH_CHECKPOINT``, the iteration's
        end, and the checkpoint after the last of these events."""
        state = self.fire(Event.EPOCH_END, state)
        t = state.time
        state = state.replace(time=t._replace(epoch=t.epoch + 1, batch_in_epoch=0))
        epoch, done = t.epoch + 1, t.step >= self.total
        if self.eval_on is not None and _due(self.eval_on[2], "epochs", epoch):
            state = self.evaluate(state, Event.EPOCH_END)
        state = self.fire(Event.EPOCH_CHECKPOINT, state)
        k = self.iteration_epochs
        if done or (k is not None and epoch % k == 0):
            state = self.fire(Event.ITERATION_END, state)
            state = self.fire(Event.ITERATION_CHECKPOINT, state)
        if self.save_on is not None and (done or _due(self.save_on[1], "epochs", epoch)):
            _save(state, self.save_on[0])
        return state

    def show(
        self, *, step: dict[str, Any] | None = None, evaluation: dict[str, str] | None = None
    ) -> None:
        """Show the latest step fields and evaluation metrics on the progress bar (each kept
        until replaced, so showing one never reads the other again)."""
        if self.log_every is None:  # no progress bar
            return
        shown = (
            self.shown[0] if step is None else step,
            self.shown[1] if evaluation is None else evaluation,
        )
        self.shown = shown
        self.bar.set_postfix({**shown[0], **shown[1]})

    def evaluate(self, state: TrainState, after: Event) -> TrainState:
        """One evaluation (following the training event ``after``), recorded with its metrics
        read to Python numbers, and shown on the progress bar."""
        assert self.eval_on is not None
        data, eval_fn, _ = self.eval_on
        state, metrics = evaluate(self.step, state, data, eval_fn)
        metrics = host_metrics(metrics)
        t = state.time
        self.evaluations.append(Evaluation(t.step, t.epoch, after, metrics))
        self.show(evaluation=eval_fields(metrics))
        return state

    def evaluated_at_end(self, state: TrainState) -> bool:
        """Whether the schedule evaluated the final state already (at its last step or epoch)."""
        assert self.eval_on is not None
        t, (unit, n) = state.time, self.eval_on[2]
        if unit == "steps":
            return t.step % n == 0
        return t.batch_in_epoch == 0 and t.epoch % n == 0


def _grew(now: torch.Tensor | None, then: torch.Tensor | None) -> int:
    """How much a run's count grew between two checks (a host read), 0 when it is not kept."""
    if now is None or then is None:
        return 0
    return int(now - then.to(now.device))


def _no_batches(data: Data, epoch: int) -> str:
    """The message for an epoch whose data yielded nothing (an iterator is used up)."""
    message = f"data yielded no batches in epoch {epoch}"
    if isinstance(data, Iterator):
        message += (
            " (data is an iterator, used up after one pass: pass a list, a DataLoader or "
            "a function epoch -> iterable)"
        )
    return message


def _due(interval: tuple[str, int], unit: str, count: int) -> bool:
    return interval[0] == unit and count % interval[1] == 0


def _save(state: TrainState, path: str) -> None:
    target = path.format(step=state.time.step, epoch=state.time.epoch)
    folder = os.path.dirname(target)
    if folder:
        os.makedirs(folder, exist_ok=True)
    ckpt.save(state, target)


def load_into(
    step: TrainStep, state: TrainState, path: str | os.PathLike[str] | None
) -> TrainState:
    """``BEFORE_LOAD``, then ``path`` loaded into ``state``'s structure (when given), then
    ``AFTER_LOAD``."""
    state = step.run_event(Event.BEFORE_LOAD, state)[0]
    if path is not None:
        state = ckpt.load(path, like=state)
    return step.run_event(Event.AFTER_LOAD, state)[0]


def step_fields(state: TrainState, metrics: StepMetrics) -> dict[str, Any]:
    """The step's loss (a host sync) and the sample counts, as progress-bar fields."""
    fields = {
        "loss": f"{float(metrics.loss):.4f}",
        "fwd": state.time.samples_forwarded,
        "bwd": state.time.samples_backpropagated,
    }
    skipped = state.time.updates_skipped
    if skipped is not None and int(skipped) > 0:  # shown once any update was skipped
        fields["skipped"] = int(skipped)
    return fields


def host_metrics(metrics: Any) -> Any:
    """``metrics`` with every tensor read to Python numbers (``tolist``: a 0-d tensor becomes a
    number, others nested lists). A host read per tensor: for evaluation, not the step."""

    def read(m: Any) -> Any:
        return m.detach().tolist() if isinstance(m, torch.Tensor) else m

    return optree.tree_map(read, metrics)


def eval_fields(metrics: Any) -> dict[str, str]:
    """The scalar evaluation metrics as progress-bar fields, ``eval_<path>`` (``eval`` for a
    bare number; ``eval_<set>/<name>`` for several evaluation sets)."""
    fields: dict[str, str] = {}
    paths, leaves, _ = optree.tree_flatten_with_path(
        metrics, is_leaf=lambda m: isinstance(m, list)
    )
    for path, value in zip(paths, leaves, strict=True):
        if not isinstance(value, int | float):
            continue  # vectors and non-numbers stay in FitResult.evaluations only
        name = "/".join(str(p) for p in path)
        fields["eval_" + name if name else "eval"] = f"{value:.4g}"
    return fields
