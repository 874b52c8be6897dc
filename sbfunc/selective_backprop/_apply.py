"""Run a policy on a pytree batch: ids from a batch field, pruning, scoring only the rows
the policy reads, and counting the unscorable rows a selection leaves out."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from sbfunc import random as sbrandom
from sbfunc._finite import finite_entries, trainable_rows
from sbfunc._rows import flat_tensors
from sbfunc._tracing import host_readable
from sbfunc.batch import Field, batch_device, batch_size, extract, take
from sbfunc.module import ModuleLoss
from sbfunc.policies import Policy, PolicyState, check_scores
from sbfunc.score import Signals
from sbfunc.types import LossFn, PerSample

__all__ = [
    "Pruned",
    "apply_policy",
    "nothing_unscorable",
    "score_needed",
    "unscorable_dropped",
    "unscorable_left_out",
]


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
    n = batch_size(batch, per_sample=per_sample)
    if check_scores(scores) != n:
        raise ValueError(f"scores must have shape ({n},) for a batch of {n}, got {scores.shape}")
    id_tensor = None if ids is None else extract(batch, ids, "ids")
    # signals go only to a policy that reads them: a `select` written for 1.0 takes none
    extra = {"signals": signals} if policy.needs else {}
    if policy.prune is not None:
        if scored is not None:
            raise ValueError("a policy with prune scores every row: pass scored=None")
        return Pruned(
            *policy.prune(
                batch, scores, state, key=key, ids=id_tensor, epoch=epoch, elapsed=elapsed,
                per_sample=per_sample, **extra,
            )
        )  # fmt: skip
    sel, state = policy.select(
        scores, state, key=key, ids=id_tensor, epoch=epoch, elapsed=elapsed, scored=scored,
        **extra,
    )  # fmt: skip
    return Pruned(take(batch, sel.indices, per_sample=per_sample), sel.weights, sel.indices, state)


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
    if n == 0:  # an empty batch: no forward, and select returns an empty selection
        return torch.zeros(0, device=batch_device(batch)), None, 0
    if policy.score_rows is None:
        return score_fn(batch), None, n
    scored = policy.score_rows(state, ids, epoch)
    rows = scored.nonzero().reshape(-1)  # variable size
    if rows.shape[0] == 0:  # every row's loss is remembered: no forward at all
        return torch.zeros(n, device=scored.device), scored, 0
    fresh = score_fn(take(batch, rows, per_sample=per_sample))
    scores = torch.zeros(n, dtype=fresh.dtype, device=fresh.device)
    return (
        scores.index_put((rows.to(fresh.device),), fresh),
        scored.to(fresh.device),
        rows.shape[0],
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
    (``ModuleLoss.usable_rows``); 0 at once when :func:`nothing_unscorable` knows it (every
    score fresh). A 0-d ``int64`` tensor on the scores' device.

    Example:
        >>> model = torch.nn.Linear(2, 3)
        >>> loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy)
        >>> batch = (torch.tensor([[1.0, 2.0], [float("nan"), 0.0]]), torch.tensor([0, 1]))
        >>> unscorable_left_out(torch.ones(2), None, torch.tensor([0]), batch, loss_fn)
        tensor(1)
    """
    if scored is None and nothing_unscorable(scores, batch, per_sample=per_sample):
        return torch.scalar_tensor(0, dtype=torch.int64, device=scores.device)
    usable = loss_fn.usable_rows(batch) if isinstance(loss_fn, ModuleLoss) else None
    finite = trainable_rows(batch, usable, per_sample=per_sample)
    return unscorable_dropped(scores, scored, kept, finite=finite)


def nothing_unscorable(scores: torch.Tensor, batch: Any, *, per_sample: PerSample = None) -> bool:
    """Whether no row of ``batch`` can count as unscorable (:func:`unscorable_dropped` is 0
    whatever is kept), known for free eagerly on the CPU: every score finite (a fresh score of
    a row the loss cannot use is NaN: ``sbfunc.score.unusable_as_nan``) and every
    floating-point tensor of a tuple/list/dict batch finite, each read on the host as one sum
    (a sum that overflows sends the caller to the exact count). ``False`` when that cannot be
    read (an accelerator, tracing, another batch structure): count with tensors.

    Example:
        >>> batch = (torch.randn(4, 2), torch.arange(4))
        >>> nothing_unscorable(torch.ones(4), batch), nothing_unscorable(torch.ones(4) / 0, batch)
        (True, False)
    """
    if per_sample is not None or flat_tensors(batch) < 0 or not _finite_sum(scores):
        return False
    leaves = batch.values() if type(batch) is dict else batch
    return all(_finite_sum(t) for t in leaves if t.is_floating_point())


def _finite_sum(t: torch.Tensor) -> bool:
    """Whether ``t`` is readable on the host and its sum finite (then every entry is)."""
    return host_readable(t) and math.isfinite(float(t.sum()))
