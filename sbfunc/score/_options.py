"""The scoring options of Selective Backprop, grouped in one value."""

from __future__ import annotations

from typing import NamedTuple

import torch

from sbfunc.batch import Field
from sbfunc.module import check_loss_fn
from sbfunc.types import LossFn

__all__ = ["Scoring", "check_scoring"]


class Scoring(NamedTuple):
    """How :class:`SelectiveBackprop` scores the batch (every field has a working default).

    Attributes:
        loss_fn: the per-sample score, ``loss_fn(params, buffers, batch) -> Tensor[N]``
            (higher = more useful to backpropagate; usually the loss). ``None`` (default): the
            training step's loss, which :func:`sbfunc.make_train_step` gives through
            ``SelectiveBackprop.for_step``. A :class:`sbfunc.module.ModuleLoss` is scored in eval
            mode (``loss_fn.with_mode("eval")``: deterministic, no BatchNorm statistics
            updates) unless ``train=True``.
        train: score in the model's train mode (Composer's behaviour: dropout noise, BatchNorm
            statistics updated by the scoring pass).
        dtype: run the scoring forward under ``torch.autocast`` with this dtype
            (``torch.bfloat16`` on CPU; ``torch.float16`` or ``torch.bfloat16`` on CUDA):
            cheaper scores whose ranking agrees closely with full precision (measured in
            ``benchmarks/scoring.py``). ``None``: the model's own precision.
        input: where the input sits in the batch, for downsampling (an int or a str field).
        head: the name of the model's head (``model.get_submodule(head)``), whose input is the
            penultimate feature a policy may read (``Policy.needs`` with ``"features"``) and
            whose output is the logits; ``None``: the last ``nn.Linear`` the forward calls,
            which must return the logits (else the scoring forward raises, asking for
            ``head``).
        reuse_losses: record the training forward's per-sample losses of the kept rows in
            the policy's per-id state on every step (``AFTER_LOSS``), so a policy that
            remembers losses (``Policy.record``: Stale-SB, Loshchilov, InfoBatch) needs fewer
            scoring forwards. ``None`` (default): on when the policy can record and scoring
            and training see the same losses (``train=True``, or a ``per_sample_loss`` model
            without dropout or batch normalization).

    Example:
        >>> sbfunc.score.Scoring(dtype=torch.bfloat16)
        Scoring(loss_fn=None, train=False, dtype=torch.bfloat16, input=0, reuse_losses=None,
                head=None)

    References:
        Jiang et al. 2019 (the scoring forward); MosaicML Composer ``SelectiveBackprop``
        (train-mode scoring).
    """

    loss_fn: LossFn | None = None
    train: bool = False
    dtype: torch.dtype | None = None
    input: Field = 0
    reuse_losses: bool | None = None
    head: str | None = None


def check_scoring(scoring: Scoring, scale_factor: float) -> Scoring:
    """Validate :class:`Scoring` options (for a ``scale_factor``) and return them.

    Args:
        scoring: the options.
        scale_factor: the spatial scale of the scoring input (``input`` must then be a field).

    Returns:
        ``scoring`` unchanged.

    Raises:
        TypeError: for a field of the wrong type (a module as ``loss_fn``: wrap it with
            :func:`sbfunc.per_sample_loss`).

    Example:
        >>> from sbfunc.score import check_scoring
        >>> check_scoring(sbfunc.score.Scoring(train="yes"), 1.0)
        Traceback (most recent call last):
        ...
        TypeError: scoring.train must be True or False, got 'yes'
    """
    if not isinstance(scoring, Scoring):
        raise TypeError(f"scoring must be an sbfunc.score.Scoring(...), got {scoring!r:.80}")
    if scoring.loss_fn is not None:
        check_loss_fn(scoring.loss_fn, "scoring.loss_fn")
    if not isinstance(scoring.train, bool):
        raise TypeError(f"scoring.train must be True or False, got {scoring.train!r}")
    dtype = scoring.dtype
    if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
        raise TypeError(
            "scoring.dtype must be a floating torch.dtype (torch.bfloat16, torch.float16) or "
            f"None, got {dtype!r}"
        )
    if scale_factor != 1.0 and (
        isinstance(scoring.input, bool) or not isinstance(scoring.input, int | str)
    ):
        raise TypeError(
            f"with scale_factor != 1, scoring.input must be an int or str batch field, got "
            f"{scoring.input!r}"
        )
    if scoring.reuse_losses is not None and not isinstance(scoring.reuse_losses, bool):
        raise TypeError(
            f"scoring.reuse_losses must be True, False or None, got {scoring.reuse_losses!r}"
        )
    if scoring.head is not None and (not isinstance(scoring.head, str) or not scoring.head):
        raise TypeError(
            f"scoring.head must be a submodule's name (a str) or None, got {scoring.head!r}"
        )
    return scoring
