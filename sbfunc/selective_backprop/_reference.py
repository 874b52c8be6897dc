"""Reference models for selection: the losses of a model trained on clean held-out data, as a
frozen model's forward inside the step (:func:`reference_model`) or as a table computed once
over a dataset and streamed with the batches (:func:`reference_losses`, :func:`reference_field`).

One sign convention throughout: a reference gives *losses* (``-log p``, >= 0), as RHO-LOSS's
irreducible loss (:func:`sbfunc.policies.rho_loss`) and Bayesian selection's
``reference_losses`` take them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

import torch

from sbfunc.batch import Field, check_field, extract
from sbfunc.engine import Context
from sbfunc.module import ModuleLoss, TokenLosses, check_state
from sbfunc.types import Params
from sbfunc.validation import check_choice, check_int

__all__ = [
    "ModelReference",
    "Reference",
    "ReferenceState",
    "TableReference",
    "reference_field",
    "reference_losses",
    "reference_model",
]


class ReferenceState(NamedTuple):
    """A frozen reference model's tensors, in its algorithm's state: checkpointed and restored
    with the run, never trained.

    Attributes:
        params: the reference's parameters by name.
        buffers: its buffers by name.
    """

    params: Params
    buffers: Params


class ModelReference(NamedTuple):
    """A frozen reference model run inside the step (:func:`reference_model`)."""

    loss_fn: ModuleLoss
    params: Params
    buffers: Params

    def init(self) -> ReferenceState:
        """Private copies of the reference's tensors (the state that carries them)."""
        return ReferenceState(
            {k: v.detach().clone() for k, v in self.params.items()},
            {k: v.detach().clone() for k, v in self.buffers.items()},
        )

    def token_losses(self, ctx: Context, state: ReferenceState) -> torch.Tensor:
        """The reference's token losses of ``ctx.batch`` (no gradient, eval mode)."""
        with torch.no_grad():
            logits = self.loss_fn.forward(state.params, state.buffers, ctx.batch)
            tokens = self.loss_fn.elements(logits, ctx.batch)
        if not isinstance(tokens, TokenLosses):
            raise ValueError(
                "the reference's loss is not over tokens: build it with a token criterion, e.g. "
                "sbfunc.per_sample_loss(reference, sbfunc.module.next_token_cross_entropy, ...)"
            )
        return tokens.losses.detach()


class TableReference(NamedTuple):
    """Reference losses read from a batch field (:func:`reference_field`)."""

    field: Field

    def init(self) -> None:
        """No state: the losses travel with the batches."""
        return None

    def token_losses(self, ctx: Context, state: None) -> torch.Tensor:
        """The batch's reference losses ``[N, L]``, cut to the token losses' length (column
        ``t`` is the loss of token ``t``'s target, so a table as long as the sequences serves
        any shift and any truncation, :class:`sbfunc.algorithms.SeqLengthWarmup`'s too)."""
        table = extract(ctx.batch, self.field, "reference losses field")
        if ctx.token_losses is None:
            return table
        length = ctx.token_losses.shape[1]
        if not isinstance(table, torch.Tensor) or table.dim() < 2 or table.shape[1] < length:
            got = tuple(table.shape) if isinstance(table, torch.Tensor) else type(table).__name__
            raise ValueError(
                f"the batch field {self.field!r} must hold [N, L] reference token losses with "
                f"L >= {length} (the token losses' length), got {got}; build it with "
                "sbfunc.selective_backprop.reference_losses"
            )
        return table[:, :length]


@runtime_checkable
class Reference(Protocol):
    """Where a token selection reads the reference's token losses: the policy's shape, an
    ``init()`` that makes the state (kept in the selection's algorithm state, checkpointed with
    the run) and a pure ``token_losses(ctx, state)``. :func:`reference_model` and
    :func:`reference_field` build the two that ship (:class:`ModelReference`,
    :class:`TableReference`); any object with these two methods is one.

    Example:
        >>> from sbfunc.selective_backprop import Reference, reference_field
        >>> isinstance(reference_field(), Reference)
        True

    References:
        DeepMind optax ``GradientTransformation`` (an ``init`` and a pure function of an
        explicit state); Lin et al. 2024, "Rho-1" (the reference model).
    """

    def init(self) -> Any:
        """The state the selection keeps for this reference (``None``: none)."""
        ...

    def token_losses(self, ctx: Context, state: Any) -> torch.Tensor:
        """The reference's losses of ``ctx.batch``'s tokens, ``[N, L]``, from ``state``."""
        ...


def reference_model(loss_fn: ModuleLoss, params: Params, buffers: Params) -> ModelReference:
    """A frozen reference model, run by the selection inside every step (no gradient, eval
    mode); its tensors live in the algorithm's state, so they are checkpointed and restored
    with the run and never trained.

    Args:
        loss_fn: the reference's per-sample loss over tokens,
            ``sbfunc.per_sample_loss(reference, sbfunc.module.next_token_cross_entropy, ...)``
            (the training loss's criterion, inputs and target).
        params: the reference's trained parameters.
        buffers: its buffers.

    Returns:
        A :class:`ModelReference` for :class:`~sbfunc.selective_backprop.TokenSelection`.

    Raises:
        TypeError: for a ``loss_fn`` that is not a ``ModuleLoss``.
        ValueError: for ``params``/``buffers`` that do not match its module.

    Example:
        >>> ref = sbfunc.models.CausalLM(d_model=16, num_heads=2, num_layers=1, max_len=8)
        >>> ref_loss = sbfunc.per_sample_loss(ref, sbfunc.module.next_token_cross_entropy,
        ...                                   input="input_ids", target="labels")
        >>> reference = sbfunc.selective_backprop.reference_model(
        ...     ref_loss, *sbfunc.split_module(ref))
        >>> sorted(reference.init().params)[:2]
        ['blocks.0.attn.in_proj_bias', 'blocks.0.attn.in_proj_weight']

    References:
        Lin et al. 2024, "Rho-1: Not All Tokens Are What You Need" (a reference model trained
        on high-quality data scores every token).
    """
    if not isinstance(loss_fn, ModuleLoss):
        raise TypeError(
            "loss_fn must be the reference's sbfunc.per_sample_loss(model, criterion, ...), got "
            f"{type(loss_fn).__name__}"
        )
    check_state(loss_fn, params, buffers, name="loss_fn")
    return ModelReference(loss_fn.with_mode("eval"), dict(params), dict(buffers))


def reference_field(field: Field = "reference_losses") -> TableReference:
    """Reference losses streamed with the batches in ``field``: ``[N, L]`` token losses (a
    table from :func:`reference_losses` added to the dataset's rows), read by the selection
    instead of a reference forward in the step.

    Args:
        field: the batch field (a str for dict batches, an int for tuples).

    Example:
        >>> sbfunc.selective_backprop.reference_field()
        TableReference(field='reference_losses')
    """
    return TableReference(check_field("field", field))


def reference_losses(
    loss_fn: ModuleLoss,
    params: Params,
    buffers: Params,
    rows: Mapping[str, torch.Tensor],
    *,
    per: Literal["token", "row"] = "token",
    batch_size: int = 64,
    ids: str | None = "auto",
) -> torch.Tensor:
    """A reference model's losses over a dataset, computed once (no gradient, eval mode): the
    table a selection reads instead of running the reference in every step.

    With ``per="token"`` the result is ``[S, L]``, as long as the rows' sequences: column ``t``
    holds the loss of the target at token position ``t`` (0 where there is none: padding, the
    last position of a shifted criterion; never read), so ``{**rows, "reference_losses": table}``
    streams it with :func:`sbfunc.datasets.dict_batches` and :func:`reference_field` reads it.
    With ``per="row"`` it is each row's mean over its real tokens, **indexed by the rows' ids**
    when they have an ``ids`` field (``ids="auto"``, the default; ``ids=`` names another
    field): entry ``j`` belongs to the row of id ``j`` (NaN where no row has that id), the
    table :func:`sbfunc.policies.rho_loss` reads by id (``irreducible``) even when the rows are
    a split or a stream whose ids are not ``0..S-1``; without ids (``ids=None``, or no such
    field) it is ``[S]`` in row order.

    Args:
        loss_fn: the reference's per-sample loss over tokens.
        params: its parameters.
        buffers: its buffers.
        rows: the dataset as a mapping of ``[S, ...]`` tensors (the batch fields).
        per: ``"token"`` or ``"row"``.
        batch_size: rows per forward.
        ids: with ``per="row"``, the field of integer row ids the table is indexed by;
            ``"auto"``: ``"ids"`` when the rows have it; ``None``: row order.

    Returns:
        A float tensor on the rows' device.

    Raises:
        ValueError: for a loss that is not over tokens, ``per`` or ``batch_size`` out of
            range, a missing ``ids`` field, or ids that are negative, repeated or not integers.

    Example:
        >>> rows = sbfunc.datasets.byte_rows([b"def f(x):\\n    return x\\n"], 8)
        >>> ref = sbfunc.models.CausalLM(d_model=16, num_heads=2, num_layers=1, max_len=8)
        >>> ref_loss = sbfunc.per_sample_loss(ref, sbfunc.module.next_token_cross_entropy,
        ...                                   input="input_ids", target="labels")
        >>> table = sbfunc.selective_backprop.reference_losses(
        ...     ref_loss, *sbfunc.split_module(ref), rows)
        >>> table.shape == rows["input_ids"].shape, bool((table[:, -1] == 0).all())
        (True, True)

    References:
        Mindermann et al. 2022, "Prioritized Training on Points that are Learnable, Worth
        Learning, and Not Yet Learnt" (the irreducible loss table, computed once).
    """
    per = check_choice(per, "per", ("token", "row"))
    batch_size = check_int(batch_size, "batch_size", low=1)
    reference = reference_model(loss_fn, params, buffers)
    state = reference.init()
    size = next(iter(rows.values())).shape[0]
    parts = []
    for start in range(0, size, batch_size):
        batch = {k: v[start : start + batch_size] for k, v in rows.items()}
        parts.append(_table_rows(reference, state, batch, per))
    table = torch.cat(parts)
    field = ("ids" if "ids" in rows else None) if ids == "auto" else ids
    return table if per == "token" or field is None else _by_id(table, rows, field)


def _by_id(table: torch.Tensor, rows: Mapping[str, torch.Tensor], field: str) -> torch.Tensor:
    """``table`` (in row order) placed at the rows' ids, NaN where no row has an id."""
    if field not in rows:
        raise ValueError(
            f"reference_losses: ids={field!r} is not a field of the rows "
            f"(fields: {sorted(rows)}); pass ids=None for a table in row order"
        )
    row_ids = rows[field]
    if row_ids.dtype.is_floating_point or row_ids.dtype == torch.bool or row_ids.ndim != 1:
        raise ValueError(
            f"reference_losses: ids={field!r} must be a 1-D integer tensor, got "
            f"{row_ids.dtype} of shape {tuple(row_ids.shape)}"
        )
    if len(row_ids) and (int(row_ids.min()) < 0 or len(torch.unique(row_ids)) < len(row_ids)):
        raise ValueError(f"reference_losses: the ids in {field!r} must be distinct and >= 0")
    size = int(row_ids.max()) + 1 if len(row_ids) else 0
    out = table.new_full((size,), torch.nan)
    out[row_ids.to(table.device)] = table
    return out


def _table_rows(
    reference: ModelReference, state: ReferenceState, batch: dict[str, Any], per: str
) -> torch.Tensor:
    loss_fn = reference.loss_fn
    with torch.no_grad():
        tokens = loss_fn.elements(loss_fn.forward(state.params, state.buffers, batch), batch)
    if not isinstance(tokens, TokenLosses):
        raise ValueError(
            "reference_losses needs a loss over tokens: build it with a token criterion, e.g. "
            "sbfunc.module.next_token_cross_entropy"
        )
    if per == "row":
        return tokens.row_means()
    losses = tokens.masked()  # 0 where there is no target (a NaN would mark the row corrupt)
    length = extract(batch, loss_fn.target, "target").shape[1]
    if losses.shape[1] < length:  # a shifted criterion: its last positions have no target
        pad = losses.new_zeros((losses.shape[0], length - losses.shape[1]))
        losses = torch.cat([losses, pad], dim=1)
    return losses
