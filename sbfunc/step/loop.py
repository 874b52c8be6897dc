"""The loop helper: epoch-level events, elapsed time, progress and sample accounting."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sized
from typing import Any, NamedTuple

from tqdm.auto import tqdm

from sbfunc.engine import Event, TrainState
from sbfunc.step.train_step import StepMetrics, TrainStep
from sbfunc.validation import check_int

__all__ = ["Duration", "FitResult", "fit"]

Data = Iterable[Any] | Callable[[int], Iterable[Any]]


class Duration(NamedTuple):
    """Training length in epochs or in steps (exactly one of them).

    Example:
        >>> sbfunc.Duration(epochs=3).total_steps(steps_per_epoch=10)
        30

    References:
        MosaicML Composer ``Time`` and ``TimeUnit`` (durations in epochs or batches).
    """

    epochs: int | None = None
    steps: int | None = None

    def total_steps(self, steps_per_epoch: int) -> int:
        """Total optimizer steps for ``steps_per_epoch`` batches per epoch."""
        if (self.epochs is None) == (self.steps is None):
            raise ValueError(
                "give exactly one of epochs or steps, "
                f"got epochs={self.epochs}, steps={self.steps}"
            )
        which = "epochs" if self.epochs is not None else "steps"
        value = check_int(self.epochs if self.epochs is not None else self.steps, which, low=1)
        return self.steps if self.steps is not None else value * steps_per_epoch


class FitResult(NamedTuple):
    """What :func:`fit` returns.

    Attributes:
        state: the final train state.
        history: one :class:`StepMetrics` per step run by this call (empty with
            ``fit(..., history=False)``).

    Example:
        >>> state = sbfunc.TrainState({}, {}, sbfunc.random.key(0))
        >>> sbfunc.FitResult(state, []).history
        []

    References:
        MosaicML Composer ``Trainer.fit``.
    """

    state: TrainState
    history: list[StepMetrics]


def _epoch_batches(data: Data, epoch: int) -> Iterable[Any]:
    return data(epoch) if callable(data) else data


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
) -> FitResult:
    """Run a training loop around a :class:`TrainStep`, firing the epoch-level events.

    Fires ``FIT_START`` (``INIT`` fired in ``step.init``), then per epoch
    ``EPOCH_START``, the steps, ``EPOCH_END``, and finally ``FIT_END``, through the step's own
    algorithms and passes. Before every step ``time.elapsed`` is set to
    ``steps_done / total_steps`` (a fraction in [0, 1]); after every epoch ``time.epoch`` is
    incremented and ``time.batch_in_epoch`` reset. A state loaded from a checkpoint resumes
    where it stopped: finished epochs and the batches already seen in the current one are
    skipped, so a resumed run equals an uninterrupted one when ``data`` is deterministic.

    Selective methods change what progress means, so the progress bar and ``state.time``
    report forward samples (scoring + training forwards) and backpropagated samples separately.
    Reading the loss for the bar is a host sync; it happens every ``log_every`` steps and at
    the end only, and never with ``progress=False``.

    Args:
        step: from :func:`sbfunc.make_train_step` (or ``torch.compile`` of one).
        state: initial (or resumed) state.
        data: a re-iterable of batches with ``len`` (a list, a DataLoader) or a function
            ``epoch -> iterable`` (for per-epoch shuffling from a key).
        epochs: duration in epochs; or
        steps: duration in steps.
        steps_per_epoch: batches per epoch when ``data`` has no ``len``.
        progress: show a tqdm progress bar.
        log_every: steps between progress-bar loss updates.
        stop_after: return once ``time.step`` reaches this value, before the end of the
            duration (a preemption point): ``FIT_END`` does not fire and the returned state,
            saved with :mod:`sbfunc.checkpoint` and passed to ``fit`` again with the same
            duration, continues exactly as if never stopped.
        history: keep every step's :class:`StepMetrics` (their loss tensors stay alive);
            ``False`` keeps none.

    Returns:
        A :class:`FitResult`.

    Example:
        >>> model = torch.nn.Linear(2, 2)
        >>> loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy)
        >>> step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1))
        >>> state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))
        >>> data = [(torch.randn(4, 2), torch.randint(0, 2, (4,))) for _ in range(3)]
        >>> result = sbfunc.fit(step, state, data, epochs=2, progress=False)
        >>> result.state.time.step, result.state.time.epoch, result.state.time.elapsed
        (6, 2, 1.0)

    References:
        MosaicML Composer ``Trainer.fit`` events and ``Time``.
    """
    if steps_per_epoch is None:
        probe = _epoch_batches(data, 0)
        if not isinstance(probe, Sized):
            raise ValueError("data has no len(); pass steps_per_epoch")
        steps_per_epoch = len(probe)
    if isinstance(steps_per_epoch, bool) or not isinstance(steps_per_epoch, int):
        raise TypeError(f"steps_per_epoch must be an int, got {steps_per_epoch!r}")
    if steps_per_epoch < 1:
        raise ValueError(f"steps_per_epoch must be >= 1, got {steps_per_epoch}")
    total = Duration(epochs, steps).total_steps(steps_per_epoch)
    check_int(log_every, "log_every", low=1)
    limit = total
    if stop_after is not None:
        check_int(stop_after, "stop_after", low=1)
        limit = min(total, stop_after)

    if not isinstance(history, bool):
        raise TypeError(f"history must be True or False, got {history!r}")
    kept: list[StepMetrics] = []
    last: StepMetrics | None = None
    state, _ = step.fire(Event.FIT_START, state)
    bar = tqdm(total=total, initial=state.time.step, disable=not progress, unit="step")
    while state.time.step < limit:
        skip = state.time.batch_in_epoch
        if skip == 0:  # a resumed state is mid-epoch: its EPOCH_START has fired already
            state, _ = step.fire(Event.EPOCH_START, state)
        ran, stopped = 0, False
        for i, batch in enumerate(_epoch_batches(data, state.time.epoch)):
            if i < skip:
                continue
            if state.time.batch_in_epoch >= steps_per_epoch:
                break
            if state.time.step >= limit:
                stopped = True
                break
            state = state.replace(time=state.time._replace(elapsed=state.time.step / total))
            state, last = step(state, batch)
            if history:
                kept.append(last)
            ran += 1
            bar.update(1)
            if progress and state.time.step % log_every == 0:
                _postfix(bar, state, last)
        if ran == 0 and not stopped:
            raise ValueError(f"data yielded no batches in epoch {state.time.epoch}")
        mid_epoch = stopped or (
            state.time.step >= limit and state.time.batch_in_epoch < steps_per_epoch
        )
        if not mid_epoch:  # the epoch ran out of batches or reached steps_per_epoch
            state, _ = step.fire(Event.EPOCH_END, state)
            t = state.time
            state = state.replace(time=t._replace(epoch=t.epoch + 1, batch_in_epoch=0))
    if progress and last is not None and state.time.step % log_every != 0:
        _postfix(bar, state, last)  # the final numbers, not those of the last refresh
    bar.close()
    if state.time.step < total:  # stopped early: resume later with fit(...) again
        return FitResult(state, kept)
    state = state.replace(time=state.time._replace(elapsed=1.0))
    state, _ = step.fire(Event.FIT_END, state)
    return FitResult(state, kept)


def _postfix(bar: Any, state: TrainState, metrics: StepMetrics) -> None:
    bar.set_postfix(
        loss=f"{float(metrics.loss):.4f}",
        fwd=state.time.samples_forwarded,
        bwd=state.time.samples_backpropagated,
    )
