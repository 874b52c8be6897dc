"""Preallocated, functionally updated state tensors: a loss ring buffer and a per-id table."""

from __future__ import annotations

from typing import NamedTuple

import torch

from sbfunc._tracing import host_readable
from sbfunc.types import Device
from sbfunc.validation import check_int, check_tensor

__all__ = [
    "LossHistory",
    "LossTable",
    "history_cdf",
    "history_init",
    "history_push",
    "id_table",
    "lookup_by_id",
    "loss_table",
    "table_init",
    "table_lookup",
    "table_needs",
    "table_ranks",
    "table_record",
    "table_update",
]


class LossHistory(NamedTuple):
    """A ring buffer of the ``R`` most recent losses.

    Attributes:
        values: ``Tensor[R]`` of losses; slot ``i`` is valid once ``pushed > i``.
        pushed: 0-d ``int64`` tensor, the number of (finite) losses ever pushed.

    Example:
        >>> history_init(1024).values.shape
        torch.Size([1024])

    References:
        Jiang et al. 2019 (the loss history of size R).
    """

    values: torch.Tensor
    pushed: torch.Tensor


class LossTable(NamedTuple):
    """The latest known loss of every sample id and the epoch it was computed in.

    Attributes:
        loss: ``Tensor[M]`` of losses (0 where never seen).
        epoch: ``int64 Tensor[M]``, the epoch of each loss, ``-1`` where never seen.

    Example:
        >>> table_init(5).epoch
        tensor([-1, -1, -1, -1, -1])

    References:
        Loshchilov & Hutter 2015 (the latest known loss of every sample).
    """

    loss: torch.Tensor
    epoch: torch.Tensor


def history_init(size: int, *, device: Device = None) -> LossHistory:
    """An empty ring buffer of ``size`` losses.

    Raises:
        ValueError: for ``size < 1``.

    Example:
        >>> history_init(4)
        LossHistory(values=tensor([0., 0., 0., 0.]), pushed=tensor(0))
    """
    check_int(size, "history", low=1)
    return LossHistory(
        torch.zeros(size, device=device), torch.zeros((), dtype=torch.int64, device=device)
    )


def history_push(history: LossHistory, losses: torch.Tensor) -> LossHistory:
    """Append the finite ``losses`` to the ring buffer (the oldest are overwritten); returns a
    new buffer. NaN and infinite losses are left out, so they never poison the CDF.

    Example:
        >>> history_push(history_init(3), torch.tensor([1.0, 2.0, 3.0, 4.0]))
        LossHistory(values=tensor([4., 2., 3.]), pushed=tensor(4))
        >>> history_push(history_init(3), torch.tensor([1.0, float("nan"), 2.0]))
        LossHistory(values=tensor([1., 2., 0.]), pushed=tensor(2))
    """
    size, n = history.values.shape[0], losses.shape[0]
    dev = history.values.device
    finite = torch.isfinite(losses).to(dev)
    # The finite losses first, in their order (a stable sort of the flags), then write the
    # last R of them; the other positions write into a spare slot that is dropped.
    order = torch.argsort((~finite).to(torch.uint8), stable=True)
    values = losses.to(history.values).index_select(0, order)
    count = finite.sum()
    j = torch.arange(n, device=dev)
    keep = (j < count) & (j >= count - size)
    slot = torch.where(keep, (history.pushed + j) % size, size)
    spare = torch.cat([history.values, history.values.new_zeros(1)])
    return LossHistory(spare.index_put((slot,), values)[:size], history.pushed + count)


def history_cdf(history: LossHistory, losses: torch.Tensor) -> torch.Tensor:
    """The empirical CDF of the valid history entries at ``losses``: the share ``<= L``.

    Returns 0 for an empty history, and for non-finite losses (NaN, ``+inf``, ``-inf``): they
    rank below every finite loss (see :mod:`sbfunc.select`).

    Example:
        >>> h = history_push(history_init(8), torch.tensor([1.0, 2.0, 3.0, 4.0]))
        >>> history_cdf(h, torch.tensor([0.5, 2.0, 9.0, float("nan")]))
        tensor([0.0000, 0.5000, 1.0000, 0.0000])

    References:
        Jiang et al. 2019 (the percentile ``CDF_R(L)``).
    """
    size = history.values.shape[0]
    valid = torch.arange(size, device=history.values.device) < history.pushed
    ordered = torch.sort(torch.where(valid, history.values, torch.inf)).values
    num_valid = valid.sum()
    below = torch.searchsorted(ordered, losses.to(ordered), right=True).clamp_max(num_valid)
    cdf = below.to(losses.dtype) / num_valid.clamp_min(1).to(losses.dtype)
    return torch.where(losses.isfinite(), cdf, 0.0)


def table_init(num_ids: int, *, device: Device = None) -> LossTable:
    """A table of ``num_ids`` unseen ids.

    Raises:
        ValueError: for ``num_ids < 1``.

    Example:
        >>> table_init(2)
        LossTable(loss=tensor([0., 0.]), epoch=tensor([-1, -1]))
    """
    check_int(num_ids, "num_ids", low=1)
    return LossTable(
        torch.zeros(num_ids, device=device),
        torch.full((num_ids,), -1, dtype=torch.int64, device=device),
    )


def table_lookup(table: LossTable, ids: torch.Tensor) -> LossTable:
    """The rows of ``table`` for ``ids`` (a :class:`LossTable` of ``len(ids)`` entries).

    Example:
        >>> table_lookup(table_init(3), torch.tensor([2]))
        LossTable(loss=tensor([0.]), epoch=tensor([-1]))
    """
    ids = ids.to(table.loss.device)
    return LossTable(table.loss.index_select(0, ids), table.epoch.index_select(0, ids))


def table_update(
    table: LossTable,
    ids: torch.Tensor,
    losses: torch.Tensor,
    epoch: int | torch.Tensor,
    mask: torch.Tensor | None = None,
) -> LossTable:
    """Record ``losses`` for ``ids`` at ``epoch`` (only where ``mask``); returns a new table.

    With repeated ids in one call, which of their losses is kept is unspecified.

    Example:
        >>> table_update(table_init(3), torch.tensor([2, 0]), torch.tensor([5.0, 1.0]), 4)
        LossTable(loss=tensor([1., 0., 5.]), epoch=tensor([ 4, -1,  4]))
    """
    ids = ids.to(table.loss.device)
    old = table_lookup(table, ids)
    new_loss = losses.to(table.loss)
    new_epoch = torch.as_tensor(epoch, dtype=old.epoch.dtype, device=old.epoch.device).expand_as(
        old.epoch
    )
    if mask is not None:
        mask = mask.to(table.loss.device)
        new_loss = torch.where(mask, new_loss, old.loss)
        new_epoch = torch.where(mask, new_epoch, old.epoch)
    return LossTable(
        table.loss.index_put((ids,), new_loss), table.epoch.index_put((ids,), new_epoch)
    )


def table_ranks(table: LossTable, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Descending rank of each id's loss among all seen ids (0 = the highest loss), and the
    number of seen ids. Ties share the better rank.

    Example:
        >>> t = table_update(table_init(4), torch.tensor([0, 1, 2]), torch.tensor([1., 3., 2.]), 0)
        >>> table_ranks(t, torch.tensor([1, 0]))
        (tensor([0, 2]), tensor(3))

    References:
        Loshchilov & Hutter 2015 (ranking the whole dataset by latest known loss).
    """
    seen = table.epoch >= 0
    ordered = torch.sort(torch.where(seen, table.loss, -torch.inf)).values
    mine = table_lookup(table, ids).loss
    higher = ordered.shape[0] - torch.searchsorted(ordered, mine, right=True)
    return higher, seen.sum()


def table_needs(
    table: LossTable, ids: torch.Tensor | None, epoch: int | torch.Tensor, max_age: int | None
) -> torch.Tensor:
    """The ids whose loss must be computed: never recorded, or (with ``max_age``) recorded at
    least ``max_age`` epochs ago.

    Example:
        >>> t = table_update(table_init(3), torch.tensor([0, 1]), torch.tensor([1.0, 2.0]), 0)
        >>> table_needs(t, torch.tensor([0, 2]), 3, None), table_needs(t, torch.tensor([0]), 3, 2)
        (tensor([False,  True]), tensor([True]))

    Raises:
        ValueError: if ``ids`` is ``None``.
    """
    if ids is None:
        raise ValueError("a per-id policy needs sample ids: pass ids=<int64 Tensor[N]>")
    cached = table_lookup(table, ids).epoch
    needs = cached < 0
    if max_age is not None:
        needs = needs | (epoch - cached >= max_age)
    return needs


def table_record(
    table: LossTable,
    ids: torch.Tensor,
    losses: torch.Tensor,
    epoch: int | torch.Tensor,
    mask: torch.Tensor | None = None,
) -> LossTable:
    """:func:`table_update` of the finite ``losses`` only (and only where ``mask``): a NaN or
    infinite loss never enters a table.

    Example:
        >>> table_record(table_init(2), torch.tensor([0, 1]), torch.tensor([1.0, float("nan")]), 0)
        LossTable(loss=tensor([1., 0.]), epoch=tensor([ 0, -1]))
    """
    finite = torch.isfinite(losses)
    return table_update(table, ids, losses, epoch, mask=finite if mask is None else mask & finite)


def id_table(table: torch.Tensor, name: str, fix: str) -> torch.Tensor:
    """A private copy of a per-id table given to a policy as ``name``: checked to be a
    non-empty 1-D floating tensor (one entry per sample id), detached and cloned.

    Raises:
        TypeError: for a table that is not a floating tensor.
        ValueError: for a table that is not 1-D, or empty.

    Example:
        >>> id_table(torch.zeros(0), "irreducible", "index it by sample id")
        Traceback (most recent call last):
        ...
        ValueError: irreducible must have one entry per sample id, got an empty tensor: ...
    """
    check_tensor(table, name, dim=1, floating=True, fix=fix)
    if table.shape[0] == 0:
        raise ValueError(f"{name} must have one entry per sample id, got an empty tensor: {fix}")
    return table.detach().clone()


def loss_table(table: torch.Tensor, name: str, fix: str) -> torch.Tensor:
    """:func:`id_table` of a reference's *losses* (``-log p``, the one sign convention of every
    policy that takes a reference): a table with a negative entry and no positive one holds
    log-likelihoods, the other sign, and is refused (read once, at construction).

    Raises:
        TypeError, ValueError: as :func:`id_table`; ``ValueError`` for log-likelihoods.

    Example:
        >>> loss_table(torch.tensor([-0.1, -2.3]), "irreducible", "index it by sample id")
        Traceback (most recent call last):
        ...
        ValueError: irreducible must hold losses ..., got values in [-2.3, -0.1], ...
    """
    table = id_table(table, name, fix)
    if bool((table.max() <= 0) & (table.min() < 0)):
        raise ValueError(
            f"{name} must hold losses (-log p >= 0, as every sbfunc policy's reference does), "
            f"got values in [{float(table.min()):.4g}, {float(table.max()):.4g}], which look "
            f"like log-likelihoods; pass -{name} (the losses) instead"
        )
    return table


def lookup_by_id(table: torch.Tensor, ids: torch.Tensor, name: str, policy: str) -> torch.Tensor:
    """``table[ids]`` on ``table``'s device, for a per-id table given to a policy as ``name``.

    The ids must lie in ``[0, len(table))``. They are checked where reading them is free (CPU
    ids in eager code): an id out of range raises naming the table, its length and the id.
    Inside a compiled step, under a ``torch.func`` transform or for ids on an accelerator they
    are not read (no host sync): there an id out of range is torch's indexing error (on CUDA
    a device-side assert).

    Args:
        table: ``Tensor[M]``, one entry per sample id.
        ids: ``int Tensor[N]`` of sample ids (checked by :func:`~sbfunc.policies.check_ids`).
        name: the table's argument name, for the message (``"irreducible"``).
        policy: the policy's name, for the message.

    Returns:
        ``Tensor[N]``, the table's entries of ``ids``.

    Raises:
        ValueError: for an id below 0 or at least ``len(table)`` (CPU ids, eager code).

    Example:
        >>> lookup_by_id(torch.tensor([0.5, 1.5]), torch.tensor([1, 0]), "irreducible", "rho_loss")
        tensor([1.5000, 0.5000])
        >>> lookup_by_id(torch.zeros(3), torch.tensor([0, 7]), "table", "rho_loss")
        Traceback (most recent call last):
        ...
        ValueError: rho_loss: table has 3 entries (sample ids 0 to 2) but the largest id is 7: ...
    """
    size = table.shape[0]
    if host_readable(ids) and ids.numel() > 0:
        low, high = (int(v) for v in torch.aminmax(ids))
        if low < 0 or high >= size:
            raise ValueError(_id_range_message(name, size, policy, low, high))
    return table.index_select(0, ids.to(table.device))


def _id_range_message(name: str, size: int, policy: str, low: int, high: int) -> str:
    fix = f"pass ids that are dataset indices in [0, {size})"
    if high >= size:
        found = f"the largest id is {high}"
        fix = f"give {name} one entry per dataset index (length > {high}), or {fix}"
    else:
        found = f"an id is {low}"
    return f"{policy}: {name} has {size} entries (sample ids 0 to {size - 1}) but {found}: {fix}"
