"""Selective Backprop as an algorithm on ``AFTER_DATALOADER``."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from sbfunc import random as sbrandom
from sbfunc._frozen import replaced
from sbfunc.batch import (
    Field,
    batch_size,
    check_field,
    check_per_sample,
    check_same_spec,
    extract,
)
from sbfunc.engine import Algorithm, Context, Event
from sbfunc.module import ModuleLoss, check_loss_fn, draws_randomness, mode_dependent
from sbfunc.policies import Policy
from sbfunc.score import (
    Scoring,
    Signals,
    SignalScorer,
    check_downsampled_scoring,
    check_scale_factor,
    check_scoring,
    score_losses,
    score_signals,
)
from sbfunc.select import Selection
from sbfunc.selective_backprop._apply import ScoreBatch, select_rows
from sbfunc.selective_backprop._checks import check_policy
from sbfunc.selective_backprop._queue import Queue, empty_queue, refill
from sbfunc.selective_backprop._window import check_window, in_window
from sbfunc.types import LossFn, PerSample

__all__ = ["SelectiveBackprop"]

_SCORING = 0x5C0E  # the scoring forward's stream under this algorithm's key


class _SpecFields(NamedTuple):  # what follows from the per-sample spec (for_step sets it anew)
    per_sample: PerSample
    refill: Queue | None
    refill_size: int


class _ScoringFields(NamedTuple):  # what follows from the scoring loss (for_step sets it anew)
    reuse_losses: bool
    loss_fn: LossFn | None
    keyed_scoring: bool
    signal_scorer: SignalScorer | None  # the loss that also returns the policy's signals


_Scored = tuple[torch.Tensor, Signals | None]
"""A scoring forward's per-row scores, and the policy's signals when it needs any."""


def _keyed(score: ScoreBatch, key: torch.Tensor) -> ScoreBatch:
    def keyed_score(batch: Any, rows: int) -> _Scored:
        with sbrandom.keyed(key):
            return score(batch, rows)

    return keyed_score


class SelectiveBackprop(Algorithm):
    """Score the whole batch with a cheap no-grad forward, keep a fraction, backprop only those.

    On ``AFTER_DATALOADER``, when ``should_selective_backprop(elapsed, batch_in_epoch, start,
    end, interrupt)`` holds (decided from ``state.time`` alone), it scores every row under
    no-grad (input downsampled by ``scale_factor``), lets ``policy`` choose the kept rows with
    a key split off its own key, prunes **every** per-sample leaf of the pytree batch
    (tensors, NumPy arrays, lists of strings; ``per_sample`` says which leaves those are), and
    sets ``state.sample_weights`` from the selection. The scoring forward counts in
    ``time.samples_forwarded``. Rows it leaves out that could not be scored (a non-finite
    score or input) count in ``state.rows_unscorable``, which the step adds to
    ``rows_nonfinite`` (``unscorable_dropped``): every corrupt row counts
    once, left out here or masked by the step's guard, and :func:`sbfunc.fit` warns as it does
    without selection.

    The rows are chosen by one :class:`sbfunc.policies.Policy`: Composer's rank-power law
    with the fraction ``keep`` by default (:func:`sbfunc.policies.rank_power`), or ``policy``.
    Its state is this algorithm's own state (and so checkpoints with the rest). Per-id
    policies (Stale-SB, Loshchilov, RHO-LOSS, InfoBatch) read the sample ids from the batch
    field ``ids``; a policy that reads only some rows' scores (``Policy.score_rows``, e.g.
    :func:`~sbfunc.policies.stale_sb`) gets only those rows scored. Under data parallelism,
    wrap the policy with :func:`sbfunc.distributed.global_selection` or
    :func:`~sbfunc.distributed.local_selection`.

    **The loss and the per-sample spec are given once, to the step**:
    :func:`sbfunc.make_train_step` calls :meth:`for_step` with its loss and spec, and Selective
    Backprop scores with that loss (in eval mode) unless ``scoring`` names another one. Used on
    its own, give ``scoring=Scoring(loss_fn=...)``.

    With ``refill`` (an example batch: its structure and its number of rows ``b``), the kept
    rows wait in a FIFO queue (:class:`sbfunc.selective_backprop.Queue`) and the batch becomes
    the ``b`` oldest queued rows once ``b`` are queued, else zero rows: the step then makes no
    update (Jiang et al.'s fixed-size backprop batches; the state is
    ``(policy_state, queue)``).
    Kept rows with a non-finite score are never queued.

    The default passes run it first on ``AFTER_DATALOADER``: it scores the raw batch, and
    augmentations (CutOut, MixUp) only see the kept rows.

    Args:
        start: start of the active window, a fraction of training in [0, 1].
        end: end of the half-open window ``[start, end)``, ``>= start``.
        keep: fraction of the batch kept by the default rank-power policy, in (0, 1];
            ``None``: 0.5 (and ``None`` is stored when ``policy`` is given).
        scale_factor: spatial scale of the scoring input, in (0, 1] (if the model refuses
            the downsampled input, an eager step raises a ``ValueError`` naming the factors
            that work).
        interrupt: a plain step every ``interrupt`` batches; 0 never interrupts; 1 is refused.
        policy: the selection rule, a :class:`sbfunc.policies.Policy` (then leave ``keep``
            out); ``None``: ``rank_power(keep)``.
        scoring: how to score (:class:`Scoring`: the scoring loss, its mode and precision,
            the input field, loss reuse).
        ids: where the int64 sample ids sit in the batch (for per-id policies).
        refill: an example batch to queue kept rows into full batches of its size (see
            above); selections with weights cannot be queued and raise ``ValueError``.
        per_sample: which leaves of the batch are per-sample (:data:`sbfunc.types.PerSample`),
            for counting, scoring a subset, pruning and queueing rows; ``None``: the step's
            spec (see :meth:`for_step`), or inferred when used on its own. A spec of its own must
            equal the step's.
        name: the name in traces (and of its random stream).

    Raises:
        TypeError: for an argument of the wrong type (a module as ``scoring.loss_fn``: wrap
            it with :func:`sbfunc.per_sample_loss`).
        ValueError: for an argument out of range, or both a ``keep`` and a ``policy`` (whatever
            the value of ``keep``).

    Example:
        >>> model = torch.nn.Linear(4, 3)
        >>> loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy)
        >>> sb = sbfunc.SelectiveBackprop(start=0.0, end=1.0, keep=0.25, interrupt=0,
        ...                               scoring=sbfunc.score.Scoring(loss_fn=loss_fn))
        >>> params, buffers = sbfunc.split_module(model)
        >>> batch = (torch.randn(8, 4), torch.randint(0, 3, (8,)))
        >>> state = sbfunc.Context(sbfunc.random.key(0), params, buffers, batch=batch)
        >>> state = state.replace(own=sb.init(sbfunc.random.key(1)))
        >>> sb.match(sbfunc.Event.AFTER_DATALOADER, state)
        True
        >>> sb.apply(sbfunc.Event.AFTER_DATALOADER, state).batch[0].shape
        torch.Size([2, 4])

        With another policy from :mod:`sbfunc.policies`, and the loss from the step:

        >>> sb = sbfunc.SelectiveBackprop(0.0, 1.0, interrupt=0,
        ...                               policy=sbfunc.policies.jiang_cdf(beta=1.0))
        >>> step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1), [sb])
        >>> train_state = step.init(params, buffers, key=sbfunc.random.key(0))
        >>> train_state, metrics = step(train_state, batch)
        >>> int(train_state.algorithm_state[0].pushed)
        8

    References:
        Jiang et al. 2019, "Accelerating Deep Learning by Focusing on the Biggest Losers";
        MosaicML Composer ``SelectiveBackprop``.
    """

    selects_samples = True

    def __init__(
        self,
        start: float = 0.5,
        end: float = 0.9,
        keep: float | None = None,
        scale_factor: float = 1.0,
        interrupt: int = 2,
        *,
        policy: Policy | None = None,
        scoring: Scoring = Scoring(),  # noqa: B008 (an immutable NamedTuple)
        ids: Field | None = None,
        refill: Any = None,
        per_sample: PerSample = None,
        name: str | None = None,
    ) -> None:
        check_window(start, end, interrupt)
        self.start, self.end, self.interrupt = float(start), float(end), interrupt
        self.uses_elapsed = (self.start, self.end) != (0.0, 1.0)  # its window needs elapsed
        self.keep, self.policy = check_policy(keep, policy)
        self.scale_factor = check_scale_factor(scale_factor)
        self.scoring = check_scoring(scoring, self.scale_factor)
        self.ids = None if ids is None else check_field("ids", ids)
        if self.scoring.reuse_losses and self.policy.record is None:
            raise ValueError(
                "scoring.reuse_losses=True needs a policy that records losses (Policy.record: "
                "stale_sb, loshchilov, infobatch; data-parallel wrappers never record, as a "
                "rank's training losses would make the per-id tables differ across ranks)"
            )
        self.refill_example = refill
        self.per_sample, self.refill, self.refill_size = self._spec(check_per_sample(per_sample))
        if name is not None:
            self.name = name
        fields = self._scoring(self.scoring.loss_fn)
        self.reuse_losses: bool = fields.reuse_losses
        self.loss_fn: LossFn | None = fields.loss_fn
        self.keyed_scoring: bool = fields.keyed_scoring
        self.signal_scorer: SignalScorer | None = fields.signal_scorer

    def _spec(self, per_sample: PerSample) -> _SpecFields:
        """The per-sample spec and the empty refill queue and its size under it."""
        example = self.refill_example
        return _SpecFields(
            per_sample,
            None if example is None else empty_queue(example, per_sample=per_sample),
            0 if example is None else batch_size(example, per_sample=per_sample),
        )

    def _scoring(self, loss_fn: LossFn | None) -> _ScoringFields:
        """The scoring loss and what follows from it (loss reuse, keyed scoring)."""
        train = self.scoring.train
        module = loss_fn.module if isinstance(loss_fn, ModuleLoss) else None
        same_losses = train or (module is not None and not mode_dependent(module))
        reuse = self.scoring.reuse_losses
        if reuse is None:
            reuse = loss_fn is not None and self.policy.record is not None and same_losses
        if reuse and self.ids is None:
            raise ValueError("reuse_losses needs the batch field `ids` (per-id losses)")
        if isinstance(loss_fn, ModuleLoss) and not train:
            loss_fn = loss_fn.with_mode("eval")
        # Train-mode scoring of a model with dropout draws from this algorithm's key.
        keyed = train and module is not None and draws_randomness(module)
        needs = self.policy.needs
        scorer = None
        if needs and loss_fn is not None:
            scorer = SignalScorer(loss_fn, needs, head=self.scoring.head)
        return _ScoringFields(reuse, loss_fn, keyed, scorer)

    def for_step(self, *, loss_fn: Any, per_sample: PerSample) -> SelectiveBackprop:
        """This algorithm scoring with the step's ``loss_fn`` (in eval mode unless
        ``scoring.train``) when ``scoring`` names no loss of its own, and pruning with the
        step's ``per_sample`` spec.

        Args:
            loss_fn: the step's per-sample training loss.
            per_sample: the step's per-sample spec (:data:`sbfunc.types.PerSample`).

        Returns:
            A new :class:`SelectiveBackprop` (``self`` when nothing changes).

        Raises:
            ValueError: if this algorithm was given a ``per_sample`` spec of its own that is
                not the step's.
            TypeError: for a step loss that is not a per-sample loss function.

        Example:
            >>> model = torch.nn.Linear(4, 3)
            >>> loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy)
            >>> sb = sbfunc.SelectiveBackprop(0.0, 1.0, interrupt=0)
            >>> sb.loss_fn is None, sb.for_step(loss_fn=loss_fn, per_sample=None).loss_fn.mode
            (True, 'eval')
        """
        if self.per_sample is not None:
            check_same_spec(per_sample, [self])
        changes: dict[str, Any] = {}
        if self.scoring.loss_fn is None and loss_fn is not None:
            changes.update(self._scoring(check_loss_fn(loss_fn))._asdict())
        if per_sample is not self.per_sample:
            changes.update(self._spec(check_per_sample(per_sample))._asdict())
        return replaced(self, **changes) if changes else self

    def init(self, key: sbrandom.Key) -> Any:
        """The policy's initial state, paired with an empty queue with ``refill``."""
        policy_state = self.policy.init()
        return policy_state if self.refill is None else (policy_state, self.refill)

    events = frozenset({Event.AFTER_DATALOADER, Event.AFTER_LOSS})

    def match(self, event: Event, ctx: Context) -> bool:
        if event == Event.AFTER_LOSS:
            return self.reuse_losses
        if event != Event.AFTER_DATALOADER:
            return False
        t = ctx.time
        return in_window(t.elapsed, t.batch_in_epoch, self.start, self.end, self.interrupt)

    def apply(self, event: Event, ctx: Context) -> Context:
        if event == Event.AFTER_LOSS:  # the training forward's losses of the kept rows
            return self._record(ctx)
        if self.loss_fn is None:
            raise ValueError(
                f"{self.name} has no loss to score with: build the step with it "
                "(sbfunc.make_train_step(loss_fn, optimizer, [sb]) binds the step's loss), or "
                "give SelectiveBackprop(..., scoring=sbfunc.score.Scoring(loss_fn=...))"
            )
        return self._select(ctx, self.loss_fn)

    def _record(self, ctx: Context) -> Context:
        """Remember the training losses of the kept rows (``Policy.record``)."""
        assert self.policy.record is not None and self.ids is not None  # see __init__
        if ctx.losses is None:
            return ctx
        policy_state, queue = (ctx.own, None) if self.refill is None else ctx.own
        ids = extract(ctx.batch, self.ids, "ids")
        epoch: int | torch.Tensor = ctx.time.epoch  # 0-d tensors inside a step
        policy_state = self.policy.record(policy_state, ids, ctx.losses, epoch)
        return ctx.replace(own=policy_state if queue is None else (policy_state, queue))

    def _scorer(self, ctx: Context, loss_fn: LossFn) -> ScoreBatch:
        def scored(batch: Any, rows: int) -> _Scored:
            args = (ctx.params, ctx.buffers, batch)
            options: dict[str, Any] = dict(
                scale_factor=self.scale_factor, input=self.scoring.input,
                dtype=self.scoring.dtype, per_sample=self.per_sample, rows=rows,
            )  # fmt: skip
            if self.signal_scorer is not None:
                return score_signals(self.signal_scorer, *args, **options)
            return score_losses(loss_fn, *args, **options), None

        score: ScoreBatch = scored
        if self.keyed_scoring:
            score = _keyed(score, sbrandom.fold_in(ctx.key, _SCORING))
        if self.scale_factor != 1.0 and not torch.compiler.is_compiling():
            score = self._explained(score, ctx, loss_fn)
        return score

    def _explained(self, score: ScoreBatch, ctx: Context, loss_fn: LossFn) -> ScoreBatch:
        """``score``, with a failure of the downsampled forward explained (eagerly)."""

        def explained_score(batch: Any, rows: int) -> _Scored:
            try:
                return score(batch, rows)
            except (RuntimeError, ValueError):
                check_downsampled_scoring(
                    loss_fn, ctx.params, ctx.buffers, batch, self.scale_factor,
                    input=self.scoring.input, per_sample=self.per_sample,
                )  # fmt: skip
                raise  # the model accepts the downsampled input: another failure

        return explained_score

    def _select(self, ctx: Context, loss_fn: LossFn) -> Context:
        """Score, select, prune and count the unscorable rows left out (one pass:
        :func:`~sbfunc.selective_backprop._apply.select_rows`); queue with ``refill``."""
        policy_state, queue = (ctx.own, None) if self.refill is None else ctx.own
        queued = queue is not None and self.policy.prune is None  # rows this process queues
        score = self._scorer(ctx, loss_fn)
        sel = select_rows(
            self.policy, policy_state, ctx.batch, score, loss_fn,
            key=ctx.key, ids=self.ids, epoch=ctx.time.epoch, elapsed=ctx.time.elapsed,
            per_sample=self.per_sample, finite_only=queued,
        )  # fmt: skip
        batch, weights, own = sel.batch, sel.weights, sel.state
        if queue is not None:
            batch, queue = self._refill(queue, batch, weights)
            weights, own = None, (own, queue)
        before = ctx.rows_unscorable
        return ctx.replace(
            batch=batch,
            sample_weights=weights,
            own=own,
            samples_scored=ctx.samples_scored + sel.scored,
            rows_unscorable=sel.unscorable if before is None else before + sel.unscorable,
            kept=Selection(sel.indices, sel.weights if queue is None else None),
        )

    def _refill(self, queue: Queue, kept: Any, weights: Any) -> tuple[Any, Queue]:
        if weights is not None:
            raise ValueError(
                f"{self.name}: refill cannot queue weighted selections; use a policy without "
                "weights (e.g. jiang_cdf(beta) with reweight=False)"
            )
        return refill(queue, kept, self.refill_size, per_sample=self.per_sample)

    def __repr__(self) -> str:
        how = f"policy={self.policy!r}" if self.keep is None else f"keep={self.keep}"
        return (
            f"SelectiveBackprop(start={self.start}, end={self.end}, {how}, "
            f"scale_factor={self.scale_factor}, interrupt={self.interrupt})"
        )
