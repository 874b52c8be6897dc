"""Token-level losses: one loss per target token, the mask of the real ones, and the means that
Hugging Face computes over them.

A criterion that scores tokens returns :class:`TokenLosses` (or, for torch's class criteria, a
``[N, T...]`` loss that :func:`token_losses_of` pairs with the mask ``target != ignore_index``).
A row's loss is the mean over its real tokens (:meth:`TokenLosses.row_means`); a row without
one has none (NaN) and the training step leaves it out before the forward.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from sbfunc.batch import Field, extract
from sbfunc.validation import check_int

__all__ = [
    "TokenCrossEntropy",
    "TokenLosses",
    "TokenTargets",
    "next_token_cross_entropy",
    "token_cross_entropy",
    "token_losses_of",
]


class TokenLosses(NamedTuple):
    """Per-token losses and which tokens are real.

    Attributes:
        losses: ``[N, T...]`` floating losses, one per target token (any value where
            ``mask`` is false: it is never read).
        mask: ``[N, T...]`` bool, the real tokens (``False``: padding, ``ignore_index``).

    Example:
        >>> from sbfunc.module import TokenLosses
        >>> t = TokenLosses(torch.tensor([[1.0, 3.0], [2.0, 9.0]]),
        ...                 torch.tensor([[True, True], [True, False]]))
        >>> t.row_means(), t.counts()
        (tensor([2., 2.]), tensor([2., 1.]))
    """

    losses: torch.Tensor
    mask: torch.Tensor

    def counts(self) -> torch.Tensor:
        """``Tensor[N]``: the real tokens of each row (in the losses' dtype)."""
        return self.mask.flatten(1).sum(1).to(self.losses.dtype)

    def masked(self) -> torch.Tensor:
        """The losses with every token that is not real set to 0 (a select, so a NaN there
        never reaches a sum)."""
        return torch.where(self.mask, self.losses, self.losses.new_zeros(()))

    def row_means(self) -> torch.Tensor:
        """``Tensor[N]``: each row's mean loss over its real tokens (NaN for a row with none,
        which the step never trains on)."""
        return self.masked().flatten(1).sum(1) / self.counts()


class TokenCrossEntropy:
    """Cross-entropy of class-last logits ``[N, ..., V]`` against integer labels ``[N, ...]``
    (Hugging Face's layout), one loss per token, ``ignore_index`` labels not real; with
    ``shift=1`` the logits at position ``t`` predict the label at ``t + 1`` (a causal LM's
    loss: the labels may equal the inputs, as Hugging Face's ``ForCausalLMLoss`` takes them).

    A criterion for :func:`sbfunc.per_sample_loss`: its per-row losses are the mean over each
    row's real tokens, and the step's objective is Hugging Face's mean over every real token of
    the batch (``make_train_step(objective="tokens")``).

    Args:
        shift: 0 (token classification, masked LM) or 1 (next-token prediction).
        ignore_index: the label of a position without a target (torch's and Hugging Face's
            -100).

    Example:
        >>> logits = torch.zeros(2, 3, 4)  # uniform over 4 classes: log 4 per real token
        >>> labels = torch.tensor([[1, 2, 3], [1, -100, -100]])
        >>> sbfunc.module.next_token_cross_entropy(logits, labels).row_means()
        tensor([1.3863,    nan])
        >>> sbfunc.module.token_cross_entropy(logits, labels).row_means()
        tensor([1.3863, 1.3863])

    References:
        Hugging Face ``transformers`` ``ForCausalLMLoss`` and ``ForTokenClassification``
        (``ignore_index=-100``, the shift inside the loss); PyTorch ``F.cross_entropy``.
    """

    def __init__(self, *, shift: int = 0, ignore_index: int = -100) -> None:
        self.shift = check_int(shift, "shift", low=0, high=1)
        self.ignore_index = check_int(ignore_index, "ignore_index")

    def token_mask(self, labels: torch.Tensor) -> torch.Tensor:
        """The real targets of ``labels`` (``[N, L - shift, ...]`` bool), without logits."""
        return self._targets(labels) != self.ignore_index

    def _targets(self, labels: torch.Tensor) -> torch.Tensor:
        return labels[:, self.shift :] if self.shift else labels

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor, **_: Any) -> TokenLosses:
        targets = self._targets(labels)
        if self.shift:
            logits = logits[:, : -self.shift]
        flat = logits.reshape(-1, logits.shape[-1])
        losses = F.cross_entropy(
            flat, targets.reshape(-1), ignore_index=self.ignore_index, reduction="none"
        )
        return TokenLosses(losses.reshape(targets.shape), targets != self.ignore_index)

    def __repr__(self) -> str:
        name = "next_token_cross_entropy" if self.shift else "token_cross_entropy"
        extra = "" if self.ignore_index == -100 else f"(ignore_index={self.ignore_index})"
        return f"{name}{extra}"


token_cross_entropy = TokenCrossEntropy(shift=0)
"""Per-token cross-entropy of class-last logits (token classification, masked LM)."""

next_token_cross_entropy = TokenCrossEntropy(shift=1)
"""Next-token cross-entropy of class-last logits (a causal LM, Hugging Face's shift)."""


def token_losses_of(
    element: torch.Tensor | TokenLosses, target: Any, ignore_index: int | None
) -> TokenLosses | None:
    """The :class:`TokenLosses` of a criterion's result: as returned, or a ``[N, T...]`` loss
    of the shape of an integer target (torch's class criteria, or any criterion of yours)
    paired with ``target != ignore_index``; ``None`` for a result with no tokens (one loss per
    row, a float target's elements, or ``ignore_index=None``).

    Raises:
        ValueError: for a ``[N, ...]`` loss of another shape than its ``[N, ...]`` integer
            target (a criterion that shifts or slices its labels itself, such as a
            hand-written causal LM loss): which labels its positions score cannot be known,
            so its ignored positions cannot be left out of the mean.

    Example:
        >>> from sbfunc.module import TokenLosses
        >>> labels = torch.tensor([[3, -100]])
        >>> token_losses_of(torch.tensor([[0.5, 0.0]]), labels, -100).mask
        tensor([[ True, False]])
    """
    if isinstance(element, TokenLosses):
        return element
    token_target = (
        ignore_index is not None
        and isinstance(target, torch.Tensor)
        and not (target.is_floating_point() or target.is_complex())
        and target.dim() >= 2
        and isinstance(element, torch.Tensor)
        and element.dim() >= 2
    )
    if not token_target:
        return None
    if target.shape != element.shape:
        raise ValueError(_SHIFTED.format(tuple(element.shape), tuple(target.shape), ignore_index))
    return TokenLosses(element, target != ignore_index)


_SHIFTED = (
    "the criterion returned losses of shape {0} for integer labels of shape {1}: it shifts or "
    "slices the labels itself, so which of its positions hold an ignored label ({2}) cannot be "
    "known, and averaging them in as zeros would train on the wrong mean. Use "
    "sbfunc.module.next_token_cross_entropy (a causal LM's loss: Hugging Face's shift, -100 "
    "ignored) or token_cross_entropy as the criterion, with output='logits' for a Hugging "
    "Face model; or return one loss per position of the labels; or pass ignore_index=None to "
    "per_sample_loss if the criterion leaves nothing to ignore"
)


class TokenTargets(NamedTuple):
    """How a loss tells real tokens from padding, read from the batch alone (no forward).

    Attributes:
        ignore_index: the target label of a token that is not real, or ``None``.
        mask: ``target -> bool Tensor`` of the real targets, or ``None`` when the criterion's
            targets are not class labels (nothing is ignored).
        attention_mask: the batch field of the attention mask, ``"auto"`` or ``None``.
    """

    ignore_index: int | None
    mask: Callable[[torch.Tensor], torch.Tensor] | None
    attention_mask: Field | None

    @staticmethod
    def of(
        criterion: Any, kind: str | None, ignore_index: int | None, attention_mask: Field | None
    ) -> TokenTargets:
        """The token targets of ``criterion``: a token criterion's own mask; for any other
        criterion of integer targets ``target != ignore_index``, its own ``ignore_index``
        first (``functools.partial`` keywords, an ``nn.Module``'s attribute); none for the
        criteria of float targets (``kind == "float"``) or ``ignore_index=None``."""
        if ignore_index is not None:
            ignore_index = check_int(ignore_index, "ignore_index", fix="or None")
        if isinstance(criterion, TokenCrossEntropy):
            return TokenTargets(criterion.ignore_index, criterion.token_mask, attention_mask)
        raw = criterion.func if isinstance(criterion, functools.partial) else criterion
        given = criterion.keywords if isinstance(criterion, functools.partial) else {}
        own = given.get("ignore_index", getattr(raw, "ignore_index", ignore_index))
        if kind == "float" or own is None:
            return TokenTargets(None, None, attention_mask)
        return TokenTargets(own, functools.partial(_real, ignore_index=own), attention_mask)

    def usable(self, batch: Any, target: Field) -> torch.Tensor | None:
        """``Tensor[N]`` bools: each row has a real target and a real attention position
        (``None`` when nothing says so)."""
        ok = None
        if self.mask is not None:
            labels = extract(batch, target, "target")
            if isinstance(labels, torch.Tensor) and not labels.is_floating_point():
                real = self.mask(labels)
                ok = real.flatten(1).any(1) if real.dim() > 1 else real
        attention = self._attention(batch)
        if attention is not None:
            attended = attention.flatten(1).ne(0).any(1)
            ok = attended if ok is None else ok & attended
        return ok

    def _attention(self, batch: Any) -> torch.Tensor | None:
        if self.attention_mask is None:
            return None
        if self.attention_mask == "auto":
            found = batch.get("attention_mask") if isinstance(batch, Mapping) else None
            return found if isinstance(found, torch.Tensor) and found.dim() >= 2 else None
        return extract(batch, self.attention_mask, "attention_mask")


def _real(target: torch.Tensor, *, ignore_index: int) -> torch.Tensor:
    return target != ignore_index
