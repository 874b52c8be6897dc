"""The byte LM's training criterion: next-token cross-entropy, one loss per row."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sbfunc.validation import check_choice

__all__ = ["next_token_loss"]


def next_token_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    ignore_index: int = -100,
    reduction: str = "none",
) -> torch.Tensor:
    """Next-token cross-entropy of unshifted labels, averaged over each row's targets.

    The logits at position ``t`` predict ``labels[:, t + 1]`` (the shift Hugging Face causal
    LMs do in their loss, so ``labels`` may equal ``input_ids``); targets equal to
    ``ignore_index`` count for nothing. A row without any target (all but its first label
    ignored) has loss 0. No host sync, so it runs inside a compiled step. As a criterion of
    ``sbfunc.per_sample_loss`` (which passes ``reduction="none"``) it gives one loss per row.

    Args:
        logits: ``[N, L, V]`` float.
        labels: ``[N, L]`` int64, ``ignore_index`` where there is no target.
        ignore_index: the label of a position without a target.
        reduction: ``"none"`` (``[N]``), ``"mean"`` or ``"sum"`` over the rows.

    Returns:
        The per-row mean loss ``[N]``, or its mean or sum.

    Raises:
        ValueError: for another ``reduction``.

    Example:
        >>> from sbfunc.models import next_token_loss
        >>> logits = torch.zeros(2, 3, 4)  # uniform over 4 tokens: loss log 4 per target
        >>> labels = torch.tensor([[1, 2, 3], [1, -100, -100]])
        >>> next_token_loss(logits, labels)
        tensor([1.3863, 0.0000])

    References:
        Hugging Face ``transformers`` ``ForCausalLMLoss`` (shift inside the loss,
        ``ignore_index=-100``); Radford et al. 2018, "Improving Language Understanding by
        Generative Pre-Training".
    """
    reduction = check_choice(reduction, "reduction", ("none", "mean", "sum"))
    targets = labels[:, 1:]
    nll = F.cross_entropy(
        logits[:, :-1].transpose(1, 2).float(),
        targets,
        ignore_index=ignore_index,
        reduction="none",
    )  # [N, L - 1], 0 at ignored targets
    count = (targets != ignore_index).sum(1).clamp(min=1)
    per_row = nll.sum(1) / count
    if reduction == "none":
        return per_row
    return per_row.mean() if reduction == "mean" else per_row.sum()
