"""Run a policy on a pytree batch: ids from a batch field, pruning, scoring only the rows
the policy reads, and counting the unscorable rows a selection leaves out.

:func:`select_rows` is Selective Backprop's whole selection of one batch, in one pass: the
rows counted once (and the ids read once), scored, selected, pruned and the unscorable ones
left out counted, the count carried from stage to stage. :func:`apply_policy` and
:func:`score_needed` are its public stages, each counting the rows of the batch it is given."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from sbfunc import random as sbrandom
from sbfunc._finite import finite_entries, known_finite, trainable_rows
from sbfunc.batch import Field, batch_device, batch_size, extract, take
from sbfunc.module import ModuleLoss
from sbfunc.policies import Policy, PolicyState, check_scores
from sbfunc.score import Signals
from sbfunc.types import LossFn, PerSample

__all__ = [
    "Pruned",
    "Selected",
    "apply_policy",
    "needed_scores",
    "pruned",
    "score_needed",
    "select_rows",
    "unscorable_dropped",
    "unscorable_left_out",
]

ScoreBatch = Callable[[Any, int], "tuple[torch.Tensor, Signals | None]"]
"""``(batch, rows) -> (scores, signals)``: the scoring forward of a batch of ``rows`` rows (the
caller knows the count), with the policy's signals when it needs any (else ``None``)."""


class Pruned(NamedTuple):
    """The outcome of :func:`apply_policy`.

    Attributes:
        batch: the kept rows (every per-sample leaf pruned, structure kept).
        weights: their loss weights (``None`` for an unweighted mean).
        indices: the kept row indices into the input batch (the rows selected here; a policy
            that moves rows between processes, ``Policy.prune``, may backpropagate others).
        state: the policy's next state.

    Example:
        >>> from sbfunc.policies import top_k
        >>> from sbfunc.selective_backprop import apply_policy
        >>> policy = top_k(0.5)
        >>> out = apply_policy(policy, policy.init(), (torch.arange(4),),
        ...                    torch.tensor([0.0, 3.0, 1.0, 2.0]), key=sbfunc.random.key(0))
        >>> out.batch, out.indices
        ((tensor([1, 3]),), tensor([1, 3]))
    """

    batch: Any
    weights: torch.Tensor | None
    indices: torch.Tensor
    state: PolicyState


class Selected(NamedTuple):
    """The outcome of :func:`select_rows`: Selective Backprop's selection of one batch.

    Attributes:
        batch: the rows that go on (every per-sample leaf pruned, structure kept).
        weights: their loss weights (``None`` for an unweighted mean).
        indices: their indices into the input batch.
        state: the policy's next state.
        scored: the number of rows the scoring forward saw.
        unscorable: the rows left out that could not be scored, a 0-d ``int64`` tensor
            (:func:`unscorable_left_out`).
    """

    batch: Any
    weights: torch.Tensor | None
    indices: torch.Tensor
    state: PolicyState
    scored: int
    unscorable: torch.Tensor


def select_rows(
    policy: Policy,
    state: PolicyState,
    batch: Any,
    score: ScoreBatch,
    loss_fn: LossFn,
    *,
    key: sbrandom.Key,
    ids: Field | None,
    epoch: int | torch.Tensor,
    elapsed: float | torch.Tensor,
    per_sample: PerSample,
    finite_only: bool = False,
) -> Selected:
    """Select rows of ``batch`` with ``policy``, in one pass: count the rows and read the ids
    once, score the rows the policy reads (:func:`needed_scores`; every row, with the signals,
    for a policy that ``needs`` them), select and prune (:func:`pruned`), and count the
    unscorable rows left out (:func:`unscorable_left_out`).

    Args:
        policy: the policy.
        state: its state.
        batch: the pytree batch.
        score: its scoring forward (:data:`ScoreBatch`).
        loss_fn: the scoring loss (a module loss says which rows it can use).
        key: the selection's key.
        ids: where the sample ids sit in the batch, or ``None``.
        epoch: the current epoch.
        elapsed: the fraction of training done.
        per_sample: which leaves of ``batch`` are per-sample.
        finite_only: keep only the kept rows of finite score (rows to queue: a refill never
            queues a row the model cannot score).

    Returns:
        A :class:`Selected`.

    Example:
        >>> from sbfunc.policies import top_k
        >>> model = torch.nn.Linear(2, 3)
        >>> loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy)
        >>> batch = (torch.tensor([[1.0, 2.0], [float("nan"), 0.0]]), torch.tensor([0, 1]))
        >>> score = lambda b, n: (torch.tensor([1.0, float("nan")])[:n], None)
        >>> out = select_rows(top_k(0.5), None, batch, score, loss_fn, key=sbfunc.random.key(0),
        ...                   ids=None, epoch=0, elapsed=0.0, per_sample=None)
        >>> out.indices, out.scored, out.unscorable
        (tensor([0]), 2, tensor(1))
    """
    id_tensor = None if ids is None else extract(batch, ids, "ids")  # read once
    rows = batch_size(batch, per_sample=per_sample)  # counted once, carried below
    signals: Signals | None = None
    if policy.needs:  # it reads every row's signals (make_policy: no score_rows)
        (scores, signals), fresh, forwarded = score(batch, rows), None, rows
    else:

        def losses(part: Any, n: int) -> torch.Tensor:
            return score(part, n)[0]

        scores, fresh, forwarded = needed_scores(
            policy, state, batch, id_tensor, epoch, losses, rows, per_sample
        )
    out = pruned(
        policy, state, batch, scores, rows, key=key, ids=id_tensor, epoch=epoch,
        elapsed=elapsed, scored=fresh, per_sample=per_sample, signals=signals,
        finite_only=finite_only,
    )  # fmt: skip
    dropped = unscorable_left_out(
        scores, fresh, out.indices, batch, loss_fn, per_sample=per_sample
    )
    return Selected(out.batch, out.weights, out.indices, out.state, forwarded, dropped)


def apply_policy(
    policy: Policy,
    state: PolicyState,
    batch: Any,
    scores: torch.Tensor,
    *,
    key: sbrandom.Key,
    ids: Field | None = None,
    epoch: int | torch.Tensor = 0,
    elapsed: float | torch.Tensor = 0.0,
    scored: torch.Tensor | None = None,
    per_sample: PerSample = None,
    signals: Signals | None = None,
) -> Pruned:
    """Select rows of ``batch`` with ``policy`` and prune every per-sample leaf to them: the
    pytree-batch path (a dict batch included) from scores to the kept rows.

    A policy with ``prune`` (the data-parallel wrappers of :mod:`sbfunc.distributed` that
    rebalance kept rows across ranks) selects and prunes itself.

    Args:
        policy: a :class:`~sbfunc.policies.Policy`.
        state: its state.
        batch: any pytree batch of ``N`` rows.
        scores: ``Tensor[N]`` scores of the rows.
        key: an :mod:`sbfunc.random` key.
        ids: where the sample ids sit in the batch (an int, a str or a callable, see
            :func:`sbfunc.batch.extract`); ``None`` for policies without ids.
        epoch: the current epoch.
        elapsed: the fraction of training done.
        scored: which entries of ``scores`` are fresh (see :func:`score_needed`).
        per_sample: which leaves of ``batch`` are per-sample (:data:`sbfunc.types.PerSample`);
            ``None`` infers them.
        signals: the rows' :class:`~sbfunc.score.Signals`, for a policy that ``needs`` them.

    Returns:
        A :class:`Pruned`.

    Raises:
        TypeError: if ``scores`` is not a tensor, or as the policy raises.
        ValueError: if ``scores`` does not have one entry per row, or as the policy raises.

    Example:
        >>> from sbfunc.policies import rho_loss
        >>> from sbfunc.selective_backprop import apply_policy
        >>> policy = rho_loss(0.5, irreducible=torch.tensor([0.0, 9.0, 0.0]))
        >>> batch = {"x": torch.tensor([[1.0], [2.0], [3.0]]), "id": torch.tensor([0, 1, 2])}
        >>> out = apply_policy(policy, policy.init(), batch, torch.tensor([1.0, 9.5, 0.5]),
        ...                    key=sbfunc.random.key(0), ids="id")
        >>> out.batch["id"], out.weights
        (tensor([0]), None)
    """
    return pruned(
        policy, state, batch, scores, batch_size(batch, per_sample=per_sample),
        key=key, ids=None if ids is None else extract(batch, ids, "ids"), epoch=epoch,
        elapsed=elapsed, scored=scored, per_sample=per_sample, signals=signals,
    )  # fmt: skip


def pruned(
    policy: Policy,
    state: PolicyState,
    batch: Any,
    scores: torch.Tensor,
    rows: int,
    *,
    key: sbrandom.Key,
    ids: torch.Tensor | None,
    epoch: int | torch.Tensor,
    elapsed: float | torch.Tensor,
    scored: torch.Tensor | None,
    per_sample: PerSample,
    signals: Signals | None,
    finite_only: bool = False,
) -> Pruned:
    """:func:`apply_policy` of a batch whose ``rows`` the caller counted and whose ``ids``
    tensor it read (the stage of :func:`select_rows`); with ``finite_only``, the selected rows
    of non-finite score are left out too (before the one :func:`~sbfunc.batch.take`; the
    weights, which a refill refuses, are the selection's)."""
    if check_scores(scores) != rows:
        raise ValueError(
            f"scores must have shape ({rows},) for a batch of {rows}, got {scores.shape}"
        )
    # signals go only to a policy that reads them: a `select` written for 1.0 takes none
    extra = {"signals": signals} if policy.needs else {}
    if policy.prune is not None:
        if scored is not None:
            raise ValueError("a policy with prune scores every row: pass scored=None")
        return Pruned(
            *policy.prune(
                batch, scores, state, key=key, ids=ids, epoch=epoch, elapsed=elapsed,
                per_sample=per_sample, **extra,
            )
        )  # fmt: skip
    sel, state = policy.select(
        scores, state, key=key, ids=ids, epoch=epoch, elapsed=elapsed, scored=scored, **extra
    )
    indices = sel.indices
    if finite_only:  # never queue a row the model cannot score
        indices = indices.index_select(
            0, scores.index_select(0, indices).isfinite().nonzero().reshape(-1)
        )
    return Pruned(take(batch, indices, per_sample=per_sample), sel.weights, indices, state)


def score_needed(
    policy: Policy,
    state: PolicyState,
    batch: Any,
    ids: torch.Tensor | None,
    epoch: int | torch.Tensor,
    score_fn: Callable[[Any], torch.Tensor],
    *,
    per_sample: PerSample = None,
) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """Scores for ``policy.select``, running ``score_fn`` only on the rows the policy needs
    (``policy.score_rows``; every row when it is ``None``).

    Args:
        policy: the policy.
        state: its state.
        batch: the pytree batch.
        ids: its ``int64 Tensor[N]`` sample ids (``None`` for policies without ids).
        epoch: the current epoch.
        score_fn: ``batch -> Tensor[n]`` per-sample scores (e.g. a partial of
            :func:`sbfunc.score.score_losses`).
        per_sample: which leaves of ``batch`` are per-sample (:data:`sbfunc.types.PerSample`);
            ``None`` infers them.

    Returns:
        ``(scores, scored, forwarded)``: ``Tensor[N]`` with fresh scores on the scored rows
        (zeros elsewhere), the ``bool Tensor[N]`` of scored rows to pass as
        ``select(..., scored=...)`` (``None`` when every row was scored), and the number of
        rows scored (``score_fn`` is not called when it is 0, e.g. for an empty batch). With
        ``score_rows`` that number is data-dependent (a variable shape).

    Example:
        >>> from sbfunc.policies import stale_sb
        >>> policy = stale_sb(1.0, num_ids=4)
        >>> state = policy.record(policy.init(), torch.tensor([3]), torch.tensor([0.5]), 0)
        >>> batch, ids = torch.tensor([1.0, 2.0]), torch.tensor([0, 3])
        >>> score_needed(policy, state, batch, ids, 0, lambda b: b * 10)
        (tensor([10.,  0.]), tensor([ True, False]), 1)
    """
    n = batch_size(batch, per_sample=per_sample)
    return needed_scores(policy, state, batch, ids, epoch, lambda b, _: score_fn(b), n, per_sample)


def needed_scores(
    policy: Policy,
    state: PolicyState,
    batch: Any,
    ids: torch.Tensor | None,
    epoch: int | torch.Tensor,
    score_fn: Callable[[Any, int], torch.Tensor],
    rows: int,
    per_sample: PerSample,
) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """:func:`score_needed` of a batch of ``rows`` rows, counted by the caller; ``score_fn``
    takes the batch it scores and its row count, ``(batch, n) -> Tensor[n]``."""
    if rows == 0:  # an empty batch: no forward, and select returns an empty selection
        return torch.zeros(0, device=batch_device(batch)), None, 0
    if policy.score_rows is None:
        return score_fn(batch, rows), None, rows
    scored = policy.score_rows(state, ids, epoch)
    needed = scored.nonzero().reshape(-1)  # variable size
    if needed.shape[0] == 0:  # every row's loss is remembered: no forward at all
        return torch.zeros(rows, device=scored.device), scored, 0
    fresh = score_fn(take(batch, needed, per_sample=per_sample), needed.shape[0])
    scores = torch.zeros(rows, dtype=fresh.dtype, device=fresh.device)
    return (
        scores.index_put((needed.to(fresh.device),), fresh),
        scored.to(fresh.device),
        needed.shape[0],
    )


def unscorable_dropped(
    scores: torch.Tensor,
    scored: torch.Tensor | None,
    kept: torch.Tensor,
    *,
    finite: torch.Tensor | None = None,
) -> torch.Tensor:
    """Count the rows a selection left out that could not be scored: a non-finite score (a
    non-finite input, a scoring loss that overflowed) or a non-finite input. The step adds
    them to ``rows_nonfinite``, so selection never makes a corrupt row vanish silently.

    Args:
        scores: the ``Tensor[N]`` scores given to the policy.
        scored: which entries are fresh scores (:func:`score_needed`); ``None``: all of them.
            Placeholders are never read.
        kept: ``int64 Tensor[k]`` of the unique rows that go on to the training forward
            (the step's guard counts the corrupt ones among those itself).
        finite: ``bool Tensor[N]``, the rows whose inputs are all finite
            (:func:`sbfunc._finite.finite_rows`), so that a corrupt row that was not
            scored, or scored finite, counts too; ``None``: not checked.

    Returns:
        A 0-d ``int64`` tensor on the scores' device, without a host sync.

    Example:
        >>> scores = torch.tensor([1.0, float("nan"), float("inf"), 2.0])
        >>> unscorable_dropped(scores, None, torch.tensor([0, 2]))  # row 2 goes on
        tensor(1)
        >>> fresh = torch.tensor([True, False, True, True])  # row 1 was not scored
        >>> unscorable_dropped(scores, fresh, torch.tensor([3]))
        tensor(1)
        >>> finite = torch.tensor([False, True, True, True])  # row 0's input is not finite
        >>> unscorable_dropped(scores, fresh, torch.tensor([3]), finite=finite)
        tensor(2)
    """
    bad = ~finite_entries(scores)
    if scored is not None:
        bad = bad & scored
    if finite is not None:
        bad = bad | ~finite.to(bad.device)
    return bad.index_fill(0, kept.to(bad.device), False).sum()  # the bad rows not kept


def unscorable_left_out(
    scores: torch.Tensor,
    scored: torch.Tensor | None,
    kept: torch.Tensor,
    batch: Any,
    loss_fn: LossFn,
    *,
    per_sample: PerSample = None,
) -> torch.Tensor:
    """:func:`unscorable_dropped` of a selection from ``batch``, its rows' inputs checked for
    finiteness and, for a module loss, for a real target token and attention position
    (``ModuleLoss.usable_rows``); 0 at once when ``sbfunc._finite.known_finite`` knows it
    (every score fresh). A 0-d ``int64`` tensor on the scores' device.

    Example:
        >>> model = torch.nn.Linear(2, 3)
        >>> loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy)
        >>> batch = (torch.tensor([[1.0, 2.0], [float("nan"), 0.0]]), torch.tensor([0, 1]))
        >>> unscorable_left_out(torch.ones(2), None, torch.tensor([0]), batch, loss_fn)
        tensor(1)
    """
    if scored is None and known_finite(scores, batch, per_sample=per_sample):
        return torch.scalar_tensor(0, dtype=torch.int64, device=scores.device)
    usable = loss_fn.usable_rows(batch) if isinstance(loss_fn, ModuleLoss) else None
    finite = trainable_rows(batch, usable, per_sample=per_sample)
    return unscorable_dropped(scores, scored, kept, finite=finite)
