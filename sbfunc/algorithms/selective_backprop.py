"""Selective Backprop as an algorithm on ``AFTER_DATALOADER``."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from sbfunc import random as sbrandom
from sbfunc.batch import Field, PerSample, batch_size, check_per_sample, extract, take
from sbfunc.compat.composer import check_window, should_selective_backprop
from sbfunc.engine import Algorithm, Event, State
from sbfunc.module import LossFn, ModuleLoss, draws_randomness, mode_dependent
from sbfunc.policies import (
    Policy,
    Queue,
    apply_policy,
    dequeue,
    empty_queue,
    enqueue,
    score_needed,
)
from sbfunc.score import check_downsampled_scoring, check_scale_factor, score_losses
from sbfunc.select import Selection, check_keep, rank_power

if TYPE_CHECKING:
    from sbfunc.distributed.scope import SelectionScope

__all__ = ["SelectiveBackprop"]


SelectFn = Callable[..., Selection]
_SCORING = 0x5C0E  # the scoring forward's stream under this algorithm's key


def _keyed(
    score: Callable[[Any], torch.Tensor], key: torch.Tensor
) -> Callable[[Any], torch.Tensor]:
    def keyed_score(batch: Any) -> torch.Tensor:
        with sbrandom.keyed(key):
            return score(batch)

    return keyed_score


class SelectiveBackprop(Algorithm):
    """Score the whole batch with a cheap no-grad forward, keep a fraction, backprop only those.

    On ``AFTER_DATALOADER``, when ``should_selective_backprop(elapsed, batch_in_epoch, start,
    end, interrupt)`` holds, it scores every row with ``loss_fn`` under no-grad (input
    downsampled by ``scale_factor``), chooses the kept rows from a key split off
    its own key, prunes **every** per-sample leaf of the pytree batch (tensors, NumPy arrays,
    lists of strings; ``per_sample`` says which leaves those are), and sets
    ``state.sample_weights`` from the selection. The scoring forward counts in
    ``time.samples_forwarded``. All arguments are validated here, at construction.

    The rows are chosen either by a stateless ``select(scores, keep, *, key)`` (Composer's
    rank-power law by default) or by a selection ``policy`` from :mod:`sbfunc.policies`,
    whose state is this algorithm's own state (and so checkpoints with the rest). Per-id
    policies (Stale-SB, Loshchilov, RHO-LOSS, InfoBatch) read the sample ids from the batch
    field ``ids``; a policy that reads only some rows' scores (``Policy.score_rows``, e.g.
    :func:`~sbfunc.policies.stale_sb`) gets only those rows scored.

    With ``refill`` (an example batch: its structure and its number of rows ``b``), the kept
    rows wait in a FIFO queue (:class:`sbfunc.policies.Queue`) and the batch becomes the ``b``
    oldest queued rows once ``b`` are queued, else zero rows: the step then makes no update
    (Jiang et al.'s fixed-size backprop batches; the state is ``(policy_state, queue)``).

    The default passes keep it first on ``AFTER_DATALOADER``, so it scores the raw batch before
    augmentations (CutOut, MixUp) touch it, and those only see the kept rows.

    Args:
        start: start of the active window, a fraction of training in [0, 1].
        end: end of the half-open window ``[start, end)``, ``>= start``.
        keep: fraction of the batch kept, in (0, 1]; default 0.5. A policy sets its own
            fraction, so ``keep`` must be left out with one.
        scale_factor: spatial scale of the scoring input, in (0, 1].
        interrupt: a plain step every ``interrupt`` batches; 0 never interrupts; 1 is refused.
        loss_fn: the per-sample score, ``loss_fn(params, buffers, batch) -> Tensor[N]``
            (higher = more useful to backpropagate; usually the loss). A
            :class:`sbfunc.ModuleLoss` is scored in eval mode (``loss_fn.with_train(False)``:
            deterministic, no BatchNorm statistics updates) unless ``score_in_train_mode=True``
            (Composer's behaviour).
        select: ``select(scores, keep, *, key) -> Selection``; default
            :func:`sbfunc.rank_power`; e.g. :func:`sbfunc.top_k`, :func:`sbfunc.random_subset`.
        policy: a :class:`sbfunc.policies.Policy` instead of ``keep`` and ``select``.
        ids: where the int64 sample ids sit in the batch (for per-id policies).
        refill: an example batch to queue kept rows into full batches of its size (see
            above); selections with weights cannot be queued and raise ``ValueError``.
        input: where the input sits in the batch (for downsampling).
        score_in_train_mode: see ``loss_fn``.
        reuse_losses: record the training forward's per-sample losses of the kept rows in
            the policy's per-id state on every step (``AFTER_LOSS``), so a policy that
            remembers losses (``Policy.record``: Stale-SB, Loshchilov, InfoBatch) needs fewer
            scoring forwards. ``None`` (default): on when the policy can record and scoring
            and training see the same losses (``score_in_train_mode=True``, or a
            ``per_sample_loss`` model without dropout or batch normalization); training
            losses are train-mode losses (dropout, batch statistics), scores eval-mode ones.
        score_dtype: run the scoring forward under ``torch.autocast`` with this dtype
            (``torch.bfloat16`` on CPU; ``torch.float16`` or ``torch.bfloat16`` on CUDA):
            cheaper scores whose ranking agrees closely with full precision (measured in
            ``benchmarks/scoring.py``). ``None``: the model's own precision.
        scope: under data parallelism, which rows one selection ranges over (see
            :func:`sbfunc.distributed.selection_scope`); ``None``: this process's batch alone,
            with no communication.
        per_sample: which leaves of the batch are per-sample (:data:`sbfunc.batch.PerSample`),
            for counting, scoring a subset, pruning and queueing rows; ``None`` infers them
            (tensors and arrays of rank >= 1, lists/tuples of strings or ids). Give a
            ``[C]`` class-weight tensor ``False`` (with ``C == N`` it only looks per-sample).
            Pass the same spec to :func:`sbfunc.make_train_step`, which checks that they
            agree. Not supported with ``scope`` yet.
        name: the name in traces (and of its random stream).

    Example:
        >>> model = torch.nn.Linear(4, 3)
        >>> loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy)
        >>> sb = sbfunc.SelectiveBackprop(start=0.0, end=1.0, keep=0.25, interrupt=0,
        ...                               loss_fn=loss_fn)
        >>> params, buffers = sbfunc.split_module(model)
        >>> batch = (torch.randn(8, 4), torch.randint(0, 3, (8,)))
        >>> state = sbfunc.State(sbfunc.random.key(0), params, buffers, batch=batch)
        >>> sb.match(sbfunc.Event.AFTER_DATALOADER, state)
        True
        >>> sb.apply(sbfunc.Event.AFTER_DATALOADER, state).batch[0].shape
        torch.Size([2, 4])

        With a policy from :mod:`sbfunc.policies` (its state is ``sb.init(key)``, which
        ``step.init`` stores):

        >>> sb = sbfunc.SelectiveBackprop(0.0, 1.0, interrupt=0, loss_fn=loss_fn,
        ...                               policy=sbfunc.policies.jiang_cdf(beta=1.0))
        >>> state = state.replace(own=sb.init(sbfunc.random.key(1)))
        >>> int(sb.apply(sbfunc.Event.AFTER_DATALOADER, state).own.pushed)
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
        loss_fn: LossFn,
        select: SelectFn | None = None,
        policy: Policy | None = None,
        ids: Field | None = None,
        refill: Any = None,
        input: Field = 0,
        score_in_train_mode: bool = False,
        reuse_losses: bool | None = None,
        score_dtype: torch.dtype | None = None,
        scope: SelectionScope | None = None,
        per_sample: PerSample = None,
        name: str | None = None,
    ) -> None:
        check_window(start, end, interrupt)
        self.start, self.end, self.interrupt = float(start), float(end), interrupt
        if policy is not None:
            if not isinstance(policy, Policy):
                raise TypeError(f"policy must be an sbfunc.policies.Policy, got {policy!r}")
            if keep is not None or select is not None:
                raise ValueError("policy sets the kept fraction: leave keep and select out")
        self.policy = policy
        self.keep = check_keep(0.5 if keep is None else keep)
        self.scale_factor = check_scale_factor(scale_factor)
        if not callable(loss_fn):
            raise TypeError(f"loss_fn must be a per-sample loss function, got {loss_fn!r}")
        same_losses = score_in_train_mode or (
            isinstance(loss_fn, ModuleLoss) and not mode_dependent(loss_fn.module)
        )
        if isinstance(loss_fn, ModuleLoss) and not score_in_train_mode:
            loss_fn = loss_fn.with_train(False)
        can_record = policy is not None and policy.record is not None and scope is None
        if reuse_losses is None:
            reuse_losses = can_record and same_losses
        elif not isinstance(reuse_losses, bool):
            raise TypeError(f"reuse_losses must be True, False or None, got {reuse_losses!r}")
        elif reuse_losses and not can_record:
            raise ValueError(
                "reuse_losses=True needs a policy that records losses (Policy.record: stale_sb,"
                " loshchilov, infobatch) and no scope (a rank's training losses would make the "
                "per-id tables differ across ranks)"
            )
        if reuse_losses and ids is None:
            raise ValueError("reuse_losses needs the batch field `ids` (per-id losses)")
        self.reuse_losses = reuse_losses
        if score_dtype is not None and (
            not isinstance(score_dtype, torch.dtype) or not score_dtype.is_floating_point
        ):
            raise TypeError(
                f"score_dtype must be a floating torch.dtype (torch.bfloat16, torch.float16) "
                f"or None, got {score_dtype!r}"
            )
        self.score_dtype = score_dtype
        # Train-mode scoring of a model with dropout draws from this algorithm's key.
        self.keyed_scoring = (
            score_in_train_mode
            and isinstance(loss_fn, ModuleLoss)
            and draws_randomness(loss_fn.module)
        )
        self._fits: set[Any] = set()  # input shapes whose downsampled scoring was checked
        if self.scale_factor != 1.0 and callable(input):
            raise TypeError("with scale_factor != 1, input must be an int or str batch field")
        if select is not None and not callable(select):
            raise TypeError(f"select must be callable, got {select!r}")
        if ids is not None and (isinstance(ids, bool) or not isinstance(ids, int | str)):
            raise TypeError(f"ids must be an int or str batch field, got {ids!r}")
        self.loss_fn, self.select = loss_fn, rank_power if select is None else select
        self.ids, self.input = ids, input
        self.per_sample = check_per_sample(per_sample)
        self.refill = None if refill is None else empty_queue(refill, per_sample=per_sample)
        self.refill_size = 0 if refill is None else batch_size(refill, per_sample=per_sample)
        if scope is not None and not callable(getattr(scope, "prune", None)):
            raise TypeError(
                "scope must be a selection scope (sbfunc.distributed.selection_scope), got "
                f"{scope!r}"
            )
        if scope is not None and per_sample is not None:
            raise ValueError(
                "per_sample is not supported with scope yet (selection scopes prune and "
                "exchange rows by the default rule); leave one of them out"
            )
        self.scope = scope
        if name is not None:
            self.name = name

    def init(self, key: sbrandom.Key) -> Any:
        """The policy's initial state (``None`` without a policy), paired with an empty queue
        with ``refill``."""
        policy_state = None if self.policy is None else self.policy.init()
        return policy_state if self.refill is None else (policy_state, self.refill)

    def match(self, event: Event, state: State) -> bool:
        if event == Event.AFTER_LOSS:
            return self.reuse_losses
        if event != Event.AFTER_DATALOADER:
            return False
        t = state.time
        active = should_selective_backprop(
            t.elapsed, t.batch_in_epoch, self.start, self.end, self.interrupt
        )
        if active and self.scale_factor != 1.0:  # once per input shape, on the host
            self._check_fit(state)
        return active

    def _check_fit(self, state: State) -> None:
        shape = tuple(extract(state.batch, self.input, "input").shape[1:])
        if shape not in self._fits:
            check_downsampled_scoring(
                self.loss_fn, state.params, state.buffers, state.batch, self.scale_factor,
                input=self.input, per_sample=self.per_sample,
            )  # fmt: skip
            self._fits.add(shape)

    def apply(self, event: Event, state: State) -> State:
        clock = state.clock
        epoch: int | torch.Tensor = state.time.epoch if clock is None else clock.epoch
        policy_state, queue = (state.own, None) if self.refill is None else state.own
        if event == Event.AFTER_LOSS:  # the training forward's losses of the kept rows
            assert self.policy is not None and self.policy.record is not None
            assert self.ids is not None  # checked at construction
            if state.losses is None:
                return state
            ids = extract(state.batch, self.ids, "ids")
            policy_state = self.policy.record(policy_state, ids, state.losses, epoch)
            return state.replace(own=policy_state if queue is None else (policy_state, queue))
        batch = state.batch
        score: Callable[[Any], torch.Tensor] = partial(
            score_losses,
            self.loss_fn,
            state.params,
            state.buffers,
            scale_factor=self.scale_factor,
            input=self.input,
            dtype=self.score_dtype,
            per_sample=self.per_sample,
        )
        if self.keyed_scoring:
            score = _keyed(score, sbrandom.fold_in(state.key, _SCORING))
        elapsed: float | torch.Tensor = state.time.elapsed if clock is None else clock.elapsed
        if self.scope is not None:
            batch, weights, policy_state, forwarded = self._scoped(
                batch, score, policy_state, state.key, epoch, elapsed
            )
        elif self.policy is None:
            forwarded = batch_size(batch, per_sample=self.per_sample)
            selection = self.select(score(batch), self.keep, key=state.key)
            batch = take(batch, selection.indices, per_sample=self.per_sample)
            weights = selection.weights
        else:
            ids = None if self.ids is None else extract(batch, self.ids, "ids")
            scores, scored, forwarded = score_needed(
                self.policy, policy_state, batch, ids, epoch, score, per_sample=self.per_sample
            )
            pruned = apply_policy(
                self.policy,
                policy_state,
                batch,
                scores,
                key=state.key,
                ids=self.ids,
                epoch=epoch,
                elapsed=elapsed,
                scored=scored,
                per_sample=self.per_sample,
            )
            batch, weights, policy_state = pruned.batch, pruned.weights, pruned.state
        own = policy_state
        if queue is not None:
            batch, queue = self._refill(queue, batch, weights)
            weights, own = None, (policy_state, queue)
        return state.replace(
            batch=batch,
            sample_weights=weights,
            own=own,
            samples_scored=state.samples_scored + forwarded,
        )

    def _scoped(
        self,
        batch: Any,
        score: Callable[[Any], torch.Tensor],
        policy_state: Any,
        key: sbrandom.Key,
        epoch: int | torch.Tensor,
        elapsed: float | torch.Tensor,
    ) -> tuple[Any, torch.Tensor | None, Any, int]:
        """Score this process's rows, then let ``self.scope`` select and prune."""
        ids = None if self.ids is None else extract(batch, self.ids, "ids")
        # Every row is scored: the fresh-row mask of Policy.score_rows is not gathered.
        scores, forwarded = score(batch), batch_size(batch)
        policy = self.policy

        def select(
            scores: torch.Tensor, policy_state: Any, *, key: sbrandom.Key, ids: Any
        ) -> tuple[Selection, Any]:
            if policy is None:
                return self.select(scores, self.keep, key=key), policy_state
            return policy.select(
                scores, policy_state, key=key, ids=ids, epoch=epoch, elapsed=elapsed
            )

        assert self.scope is not None
        batch, weights, policy_state = self.scope.prune(
            select, batch, scores, ids, policy_state, key=key
        )
        return batch, weights, policy_state, forwarded

    def _refill(self, queue: Queue, kept: Any, weights: Any) -> tuple[Any, Queue]:
        if weights is not None:
            raise ValueError(
                f"{self.name}: refill cannot queue weighted selections; use a policy without "
                "weights (e.g. jiang_cdf(beta) with reweight=False)"
            )
        spec = self.per_sample
        queue = enqueue(queue, kept, per_sample=spec)
        full, queue = dequeue(queue, self.refill_size, per_sample=spec)
        if full is None:  # 0 rows: the step makes no update
            full = empty_queue(kept, per_sample=spec).rows
        return full, queue

    def __repr__(self) -> str:
        how = f"policy={self.policy!r}" if self.policy is not None else f"keep={self.keep}"
        return (
            f"SelectiveBackprop(start={self.start}, end={self.end}, {how}, "
            f"scale_factor={self.scale_factor}, interrupt={self.interrupt})"
        )
