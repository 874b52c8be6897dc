"""The policy type and the helpers every selection policy shares (the conventions are on
:mod:`sbfunc.policies`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, Protocol

import torch

from sbfunc import random as sbrandom
from sbfunc import validation
from sbfunc._tracing import replace_by_constructor
from sbfunc.policies._placement import follow, following
from sbfunc.score import Signals, check_needs, check_signals
from sbfunc.select import Selection
from sbfunc.types import EmptyState

__all__ = [
    "Policy",
    "PolicyState",
    "Record",
    "ScoreRows",
    "SelectArgs",
    "SelectPolicy",
    "as_scores",
    "bernoulli_selection",
    "check_ids",
    "check_scores",
    "horvitz_thompson",
    "make_policy",
    "select_args",
    "stateless",
]

PolicyState = Any
"""A policy state: a NamedTuple pytree of tensors and ints (checkpoints with
:mod:`sbfunc.checkpoint`)."""


class SelectPolicy(Protocol):
    """The signature of ``Policy.select`` (see :class:`Policy`), for type checkers.

    Example:
        >>> from sbfunc.policies import SelectPolicy, top_k
        >>> select: SelectPolicy = top_k(0.5).select

    References:
        DeepMind optax, ``TransformUpdateFn``.
    """

    def __call__(
        self, scores: torch.Tensor, state: PolicyState, /, **args: Any
    ) -> tuple[Selection, PolicyState]:
        """``args``: the fields of :class:`SelectArgs` by name (``key`` required)."""
        ...


ScoreRows = Callable[[PolicyState, torch.Tensor | None, "int | torch.Tensor"], torch.Tensor]
"""``(state, ids, epoch) -> bool Tensor[N]``: the rows whose scores ``select`` needs."""

Record = Callable[[PolicyState, torch.Tensor, torch.Tensor, "int | torch.Tensor"], PolicyState]
"""``(state, ids, losses, epoch) -> state``: remember losses observed outside ``select``."""

Prune = Callable[..., "tuple[Any, torch.Tensor | None, torch.Tensor, PolicyState]"]
"""``(batch, scores, state, *, key, ids, epoch, elapsed, per_sample) -> (kept_batch, weights,
indices, state)``: select and prune in one (see ``Policy.prune``)."""


class Policy(NamedTuple):
    """A selection policy: pure functions over an explicit state.

    Attributes:
        init: ``() -> state``, the initial state.
        select: ``(scores, state, *, key, ids=None, epoch=0, elapsed=0.0, scored=None,
            signals=None) -> (Selection, state)``; ``scores`` is ``Tensor[N]`` (higher = more
            useful to backpropagate; integer and bool scores count as floats, :func:`as_scores`),
            ``ids`` an ``int64 Tensor[N]`` of sample ids (required by per-id policies),
            ``epoch`` the current epoch and ``elapsed`` the fraction of training
            done (Python numbers or 0-d tensors: inside a compiled step they are tensors), and
            ``scored`` a ``bool Tensor[N]`` marking the entries of ``scores`` that are fresh
            (``None``: all; the others are placeholders the policy must not read), and
            ``signals`` the per-row :class:`~sbfunc.score.Signals` of the scoring forward that
            ``needs`` names (``None`` when it names none).
        score_rows: ``None`` when ``select`` needs every row's score, else ``(state, ids,
            epoch) -> bool Tensor[N]``, the rows it needs (it remembers the others' losses),
            so the others' scoring forward can be skipped
            (:func:`~sbfunc.selective_backprop._apply.score_needed`).
        record: ``None``, or ``(state, ids, losses, epoch) -> state`` for policies that keep
            per-id losses: remember losses computed elsewhere, e.g. by the training forward
            of the kept rows (``Scoring(reuse_losses=...)`` of Selective Backprop), so they
            need not be scored again. Non-finite losses are not recorded.
        prune: ``None``, or ``(batch, scores, state, *, key, ids, epoch, elapsed, per_sample)
            -> (kept_batch, weights, indices, state)`` for policies whose kept rows are not a
            subset of this process's batch: the data-parallel wrappers of
            :mod:`sbfunc.distributed` that move kept rows between ranks. ``indices`` are the
            rows of ``batch`` selected here.
            :func:`~sbfunc.selective_backprop.apply_policy` calls it instead of ``select`` and
            :func:`sbfunc.batch.take`.

    Example:
        >>> from sbfunc.policies import top_k
        >>> policy = top_k(0.5)
        >>> sel, state = policy.select(torch.tensor([0.1, 2.0, 0.3, 5.0]), policy.init(),
        ...                            key=sbfunc.random.key(0))
        >>> sel.indices
        tensor([1, 3])

    References:
        DeepMind optax, ``GradientTransformation(init, update)``.
    """

    init: Callable[[], PolicyState]
    select: SelectPolicy
    score_rows: ScoreRows | None = None
    record: Record | None = None
    prune: Prune | None = None
    needs: frozenset[str] = frozenset()


def check_scores(scores: torch.Tensor) -> int:
    """Validate per-sample scores (a 1-D tensor of real numbers, possibly empty) and return
    ``N``: the one rule for what a policy accepts as scores (:func:`as_scores` casts them).

    Floating, integer and bool dtypes are accepted (integer and bool scores, e.g. a count or
    a 0/1 error, are cast to the default float dtype by :func:`as_scores`, as Composer's
    ``select_using_loss`` accepts an integer loss); complex scores are refused.

    Args:
        scores: the ``scores`` argument of ``select``.

    Returns:
        The number of rows ``N``.

    Raises:
        TypeError: for a non-tensor (a list) or a complex tensor.
        ValueError: for a tensor that is not 1-D.

    Example:
        >>> from sbfunc.policies import check_scores
        >>> check_scores(torch.zeros(3)), check_scores(torch.arange(2))
        (3, 2)
        >>> check_scores(torch.zeros(0))
        0
    """
    fix = "pass one real score per row, a Tensor[N]"
    validation.check_tensor(scores, "scores", dim=1, fix=fix)
    if scores.is_complex():
        raise TypeError(f"scores must be a 1-D tensor of real numbers, got {scores.dtype}; {fix}")
    return scores.shape[0]


def as_scores(scores: torch.Tensor) -> torch.Tensor:
    """Validate per-sample scores (:func:`check_scores`) and return them as a floating tensor:
    floating scores unchanged, integer and bool scores cast to the default float dtype
    (``torch.get_default_dtype()``; integers above ``2**24`` in magnitude may round in float32
    and then tie). Every policy's ``select`` reads its scores through it.

    Args:
        scores: the ``scores`` argument of ``select``.

    Returns:
        ``Tensor[N]`` of a floating dtype, on the scores' device.

    Raises:
        TypeError: for a non-tensor or a complex tensor.
        ValueError: for a tensor that is not 1-D.

    Example:
        >>> from sbfunc.policies import as_scores
        >>> as_scores(torch.tensor([3, 1])), as_scores(torch.tensor([True, False]))
        (tensor([3., 1.]), tensor([1., 0.]))
    """
    check_scores(scores)
    if scores.dtype.is_floating_point:
        return scores
    return scores.to(torch.get_default_dtype())


def check_ids(ids: torch.Tensor | None, n: int, policy: str) -> torch.Tensor:
    """Validate the sample ids a per-id policy needs: an integer ``Tensor[N]``.

    Args:
        ids: the ``ids`` argument of ``select``.
        n: the batch size.
        policy: the policy's name, for the message.

    Raises:
        ValueError: if ``ids`` is missing (the message names both fixes:
            ``SelectiveBackprop(ids="<batch field>")`` and ``select(..., ids=...)``) or has
            the wrong shape.
        TypeError: if ``ids`` is not an integer tensor.

    Example:
        >>> from sbfunc.policies import check_ids
        >>> check_ids(torch.tensor([4, 2]), 2, "rho_loss")
        tensor([4, 2])
    """
    if ids is None:
        raise ValueError(
            f"{policy} needs sample ids, the dataset index of every row: with "
            "sbfunc.SelectiveBackprop, name the batch field that holds them, "
            'SelectiveBackprop(ids="<field holding each row\'s dataset index>"); calling the '
            "policy directly, pass select(..., ids=<int64 Tensor[N]>)"
        )
    if not isinstance(ids, torch.Tensor) or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise TypeError(f"ids must be an integer Tensor[N], got {ids!r:.60}")
    if ids.shape != (n,):
        raise ValueError(f"ids must have shape ({n},) like the scores, got {tuple(ids.shape)}")
    return ids


def horvitz_thompson(inclusion: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """Weights ``k / (N * pi_j)`` for the kept rows, so the mean of ``w * L`` over the kept
    rows is an unbiased estimate of the full-batch mean of ``L``.

    Args:
        inclusion: ``Tensor[N]`` of inclusion probabilities ``pi_i`` (> 0 for kept rows).
        kept: ``int64 Tensor[k]`` of kept row indices.

    Returns:
        ``Tensor[k]`` of weights, aligned with ``kept``.

    Example:
        >>> from sbfunc.policies import horvitz_thompson
        >>> horvitz_thompson(torch.tensor([1.0, 0.5, 0.5, 1.0]), torch.tensor([0, 2, 3]))
        tensor([0.7500, 1.5000, 0.7500])

    References:
        Horvitz & Thompson 1952, "A Generalization of Sampling Without Replacement from a
        Finite Universe".
    """
    n, k = inclusion.shape[0], kept.shape[0]
    return (k / n) / inclusion.index_select(0, kept)


def bernoulli_selection(
    inclusion: torch.Tensor, key: sbrandom.Key, *, weighted: bool
) -> Selection:
    """Keep every row independently with probability ``inclusion[i]``; at least one row.

    When no row is drawn, a row with the highest probability is kept, chosen uniformly among
    the tied ones (that event has probability ``prod(1 - pi_i)`` and is the only deviation
    from the independent law). A row kept that way with probability 0 (every row has
    probability 0, e.g. every score is non-finite) gets the weight ``k/N``, as if ``pi = 1``.

    Args:
        inclusion: ``Tensor[N]`` of probabilities in ``[0, 1]``.
        key: an :mod:`sbfunc.random` key.
        weighted: attach :func:`horvitz_thompson` weights.

    Returns:
        A :class:`Selection` with sorted unique indices of variable size ``>= 1`` (0 for
        ``N = 0``).

    Example:
        >>> from sbfunc.policies import bernoulli_selection
        >>> p = torch.tensor([0.0, 1.0, 0.0])
        >>> bernoulli_selection(p, sbfunc.random.key(0), weighted=False).indices
        tensor([1])

    References:
        Jiang et al. 2019 (independent keep probabilities); Qin et al. 2024 (random pruning).
    """
    u = sbrandom.uniform(
        key, tuple(inclusion.shape), device=inclusion.device, dtype=inclusion.dtype
    )
    mask = u < inclusion
    if inclusion.shape[0] > 0:  # no row drawn: the likeliest row, ties by the smallest draw
        likeliest = torch.where(inclusion == inclusion.max(), u, 2.0)
        top = torch.zeros_like(mask).index_fill_(0, torch.argmin(likeliest).reshape(1), True)
        mask = mask | (top & ~mask.any())
    kept = mask.nonzero().reshape(-1)  # variable size: the one unavoidable shape read
    if not weighted:
        return Selection(kept)
    return Selection(kept, horvitz_thompson(torch.where(inclusion > 0, inclusion, 1.0), kept))


@replace_by_constructor  # its copies survive a compiled frame on torch 2.11
class SelectArgs(NamedTuple):
    """The keyword arguments of ``Policy.select``, handed to a rule by :func:`make_policy`.

    Example:
        >>> from sbfunc.policies import SelectArgs
        >>> SelectArgs(sbfunc.random.key(0)).epoch
        0
    """

    key: sbrandom.Key
    ids: torch.Tensor | None = None
    epoch: int | torch.Tensor = 0
    elapsed: float | torch.Tensor = 0.0
    scored: torch.Tensor | None = None
    signals: Signals | None = None


def select_args(**kwargs: Any) -> SelectArgs:
    """``Policy.select``'s keyword arguments as a :class:`SelectArgs`: the one definition of
    what ``select`` takes besides the scores and the state.

    Raises:
        TypeError: for a missing ``key`` or a keyword ``select`` does not take, naming the
            keywords it does.

    Example:
        >>> from sbfunc.policies import select_args
        >>> select_args(key=sbfunc.random.key(0), epoch=3).epoch
        3
    """
    unknown = sorted(set(kwargs) - set(SelectArgs._fields))
    if unknown or "key" not in kwargs:
        problem = f"unexpected keywords {unknown}" if unknown else "no key"
        raise TypeError(
            f"select() got {problem}; it takes key=<sbfunc.random key> and optionally "
            f"{', '.join(f for f in SelectArgs._fields if f != 'key')}"
        )
    return SelectArgs(**kwargs)


def make_policy(
    init: Callable[[], PolicyState],
    rule: Callable[[torch.Tensor, Any, SelectArgs], tuple[Selection, Any]],
    score_rows: ScoreRows | None = None,
    record: Record | None = None,
    needs: Iterable[str] = (),
) -> Policy:
    """Build a :class:`Policy` from ``init`` and a rule ``(scores, state, args) ->
    (Selection, state)``; ``select`` validates the scores (:func:`as_scores`: integer and bool
    scores reach ``rule`` as floats) and packs its keyword arguments.
    Scores of zero rows give an empty selection and the state unchanged, without calling
    ``rule``. A policy that ``needs`` signals (:data:`sbfunc.score.SIGNALS`) reads them from
    ``args.signals``, checked to hold each one with a row per score; it cannot also skip
    scoring rows (``score_rows``).

    Example:
        >>> from sbfunc.policies import make_policy
        >>> def count_calls(scores, state, a):  # keep the highest score, count the calls
        ...     return sbfunc.select.Selection(scores.argmax().reshape(1)), state + 1
        >>> policy = make_policy(lambda: 0, count_calls)
        >>> policy.select(torch.tensor([1.0, 3.0]), policy.init(), key=sbfunc.random.key(0))
        (Selection(indices=tensor([1]), weights=None), 1)
    """

    def select(
        scores: torch.Tensor, state: PolicyState, /, **kwargs: Any
    ) -> tuple[Selection, PolicyState]:
        args = select_args(**kwargs)
        scored, signals = args.scored, args.signals
        scores = as_scores(scores)  # integer and bool scores as floats
        if scores.shape[0] == 0:  # an empty batch: nothing to select, nothing learned
            return Selection(torch.zeros(0, dtype=torch.int64, device=scores.device)), state
        if scored is not None and (scored.shape != scores.shape or scored.dtype != torch.bool):
            raise ValueError(
                f"scored must be a bool Tensor{list(scores.shape)} like the scores, got "
                f"{scored.dtype} of shape {tuple(scored.shape)}"
            )
        if needed:
            args = args._replace(signals=check_signals(signals, needed, scores.shape[0]))
        return rule(scores, follow(state, scores), args)

    needed = check_needs(needs)
    if needed and score_rows is not None:
        raise ValueError(
            "a policy that needs signals reads every row: give it no score_rows (signals of the "
            "rows it does not score would be missing)"
        )
    # the state follows the data's device (sbfunc.policies): never read on the host
    return Policy(init, select, following(score_rows, 1), following(record, 2), needs=needed)


def stateless(
    rule: Callable[[torch.Tensor, sbrandom.Key, torch.Tensor | None], Selection],
) -> Policy:
    """Lift a rule ``(scores, key, ids) -> Selection`` into a :class:`Policy` with
    :class:`EmptyState`.

    Example:
        >>> from sbfunc.policies import stateless
        >>> policy = stateless(lambda s, key, ids: sbfunc.select.Selection(s.argmax().reshape(1)))
        >>> policy.select(torch.tensor([1.0, 3.0]), policy.init(), key=sbfunc.random.key(0))
        (Selection(indices=tensor([1]), weights=None), EmptyState())

    References:
        DeepMind optax, ``stateless``.
    """
    return make_policy(EmptyState, lambda scores, state, a: (rule(scores, a.key, a.ids), state))
