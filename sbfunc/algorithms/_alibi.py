"""ALiBi: attention biased by token distance instead of position embeddings (model surgery).

The surgery :class:`Alibi` returns a copy of a model whose attention adds
``-slope_h * |i - j|`` to the scores of head ``h`` (query ``i``, key ``j``) and whose learned
position embeddings output zeros. It handles ``nn.MultiheadAttention`` (hence
``nn.Transformer*`` layers) and Hugging Face ``transformers`` models that dispatch attention
through ``AttentionInterface`` (GPT-2 and BERT are tested). As an algorithm, :class:`Alibi` is
Composer's training-time part too: on ``AFTER_DATALOADER`` it reshapes each batch into more,
shorter rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from sbfunc.algorithms._seq_length_warmup import batch_sequence_length, set_batch_sequence_length
from sbfunc.algorithms._surgery import Surgery, replace_modules
from sbfunc.engine import Algorithm, Context, Event
from sbfunc.validation import check_int, check_real

__all__ = [
    "Alibi",
    "AlibiMultiheadAttention",
    "ZeroEmbedding",
    "alibi_bias",
    "alibi_slopes",
]

AUTO_POSITION_EMBEDDINGS = ("wpe", "position_embeddings")
"""Attribute names of learned position embeddings removed by default (GPT-2, BERT)."""
HF_ATTENTION = "sbfunc_alibi"
"""The name under which the ALiBi attention is registered with ``transformers``."""


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """The per-head slopes of ALiBi: a geometric sequence, ``2 ** (-8 h / n)`` for ``n`` a
    power of two; otherwise those of the nearest lower power of two, then every other slope
    of the next power of two.

    Example:
        >>> alibi_slopes(4)
        tensor([0.2500, 0.0625, 0.0156, 0.0039])
        >>> alibi_slopes(3)
        tensor([0.0625, 0.0039, 0.2500])

    References:
        Press et al. 2022, "Train Short, Test Long: Attention with Linear Biases Enables Input
        Length Extrapolation" (and their reference implementation's slope rule).
    """
    num_heads = check_int(num_heads, "num_heads", low=1)

    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]

    power = 2 ** math.floor(math.log2(num_heads))
    slopes = geometric(power)
    if power < num_heads:
        slopes += geometric(2 * power)[0::2][: num_heads - power]
    return torch.tensor(slopes)


def alibi_bias(slopes: torch.Tensor, query_length: int, key_length: int) -> torch.Tensor:
    """The ALiBi scores bias ``[H, query_length, key_length]``: ``-slope_h * |i - j|``.

    Queries are the last ``query_length`` positions of the keys (a decoder with a cache);
    the bias has the slopes' dtype and device.

    Example:
        >>> alibi_bias(torch.tensor([0.5]), 2, 3)
        tensor([[[-0.5000, -0.0000, -0.5000],
                 [-1.0000, -0.5000, -0.0000]]])

    References:
        Press et al. 2022.
    """
    offset = key_length - query_length
    i = torch.arange(query_length, device=slopes.device)[:, None] + offset
    j = torch.arange(key_length, device=slopes.device)[None, :]
    distance = (i - j).abs().to(slopes.dtype)
    return -slopes[:, None, None] * distance


def _as_float_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
            mask, float("-inf")
        )
    return mask.to(dtype)


class AlibiMultiheadAttention(nn.MultiheadAttention):
    """``nn.MultiheadAttention`` with the ALiBi bias added to every head's scores.

    Same parameters and names as the layer it replaces, plus a non-persistent buffer
    ``alibi_slopes`` ``[num_heads]``. The bias joins ``attn_mask`` (a boolean mask becomes
    ``-inf``), the key padding mask is turned into a float mask of the same kind, and
    ``is_causal`` is applied as a mask. Build it with the surgery :class:`Alibi`.

    Example:
        >>> from sbfunc.algorithms import Alibi
        >>> mha = Alibi(16)(torch.nn.MultiheadAttention(4, 2, batch_first=True))
        >>> x = torch.randn(1, 5, 4)
        >>> mha(x, x, x, need_weights=False)[0].shape, mha.alibi_slopes
        (torch.Size([1, 5, 4]), tensor([0.0625, 0.0039]))

    References:
        Press et al. 2022; PyTorch ``nn.MultiheadAttention``.
    """

    alibi_slopes: torch.Tensor

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        batched = query.dim() == 3
        seq = 1 if self.batch_first and batched else 0
        n = query.shape[0 if self.batch_first else 1] if batched else 1
        lq, lk = query.shape[seq], key.shape[seq]
        bias = alibi_bias(self.alibi_slopes.to(query.dtype), lq, lk)
        if is_causal:
            future = torch.ones(lq, lk, dtype=torch.bool, device=query.device)
            bias = bias.masked_fill(future.triu(1 + lk - lq), float("-inf"))
        if attn_mask is not None:
            extra = _as_float_mask(attn_mask, query.dtype)
            if extra.dim() == 3:  # [N * H, L, S]
                extra = extra.view(n, self.num_heads, lq, lk)
            bias = bias + extra
        mask = bias.expand(n, self.num_heads, lq, lk).reshape(n * self.num_heads, lq, lk)
        if key_padding_mask is not None:
            key_padding_mask = _as_float_mask(key_padding_mask, query.dtype)
        return super().forward(
            query,
            key,
            value,
            key_padding_mask=key_padding_mask,
            need_weights=need_weights,
            attn_mask=mask,  # [N * H, L, S]; [H, L, S] unbatched
            average_attn_weights=average_attn_weights,
            is_causal=False,
        )


def _off_fast_path(module: nn.Module, args: Any) -> None:
    """A no-op pre-hook. ``nn.TransformerEncoderLayer`` calls a fused kernel that bypasses
    ``self_attn.forward`` in eval mode without grad, unless a submodule has a hook."""


class ZeroEmbedding(nn.Module):
    """Stands in for a removed position embedding: zeros of shape ``[*ids.shape, dim]``.

    Args:
        dim: the embedding width.
        dtype: the dtype of the zeros.

    Example:
        >>> from sbfunc.algorithms import ZeroEmbedding
        >>> ZeroEmbedding(3, torch.float32)(torch.arange(2)).shape
        torch.Size([2, 3])

    References:
        Press et al. 2022 (ALiBi models have no position embeddings); MosaicML Composer
        ``zero_and_freeze_expand_position_embeddings``.
    """

    def __init__(self, dim: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.dim, self.dtype = dim, dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*ids.shape, self.dim, dtype=self.dtype, device=ids.device)


def _hf_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """ALiBi attention for ``transformers``' ``AttentionInterface``: ``query`` ``[B, H, L, D]``,
    an additive ``[B, 1, L, S]`` mask (the eager mask, causal for decoders) or ``None``."""
    slopes = alibi_slopes(query.shape[1]).to(device=query.device, dtype=query.dtype)
    bias = alibi_bias(slopes, query.shape[2], key.shape[2])
    mask = bias if attention_mask is None else bias + attention_mask.to(query.dtype)
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=mask,
        dropout_p=dropout,
        scale=scaling,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


def _use_hf_alibi(model: nn.Module) -> None:
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, eager_mask
    except ImportError as err:  # pragma: no cover - depends on the installed version
        raise RuntimeError(
            "ALiBi surgery on a transformers model needs transformers >= 4.53 "
            "(AttentionInterface and AttentionMaskInterface)"
        ) from err
    AttentionInterface.register(HF_ATTENTION, _hf_attention)
    AttentionMaskInterface.register(HF_ATTENTION, eager_mask)  # additive float masks
    model.set_attn_implementation(HF_ATTENTION)  # type: ignore[operator]


def _longer_positions(m: nn.Module, max_sequence_length: int) -> None:
    """Lengthen BERT-style ``position_ids``/``token_type_ids`` buffers ``[1, P]``."""
    for name, fill in (("position_ids", None), ("token_type_ids", 0)):
        old = m._buffers.get(name)
        if old is None or old.dim() != 2 or old.shape[1] >= max_sequence_length:
            continue
        new = torch.arange(max_sequence_length, dtype=old.dtype, device=old.device)[None]
        m._buffers[name] = new if fill is None else torch.full_like(new, fill)


def _alibi(module: nn.Module, max_len: int, names: frozenset[str] | None) -> nn.Module:
    """The ALiBi surgery of :class:`Alibi` (its arguments validated)."""
    changed: list[str] = []
    hf_models: list[nn.Module] = []

    def policy(name: str, m: nn.Module) -> nn.Module | None:
        attr = name.rpartition(".")[2]
        wanted = attr in AUTO_POSITION_EMBEDDINGS if names is None else name in names
        if wanted and isinstance(m, nn.Embedding):
            changed.append(name)
            return ZeroEmbedding(m.embedding_dim, m.weight.dtype)
        if type(m) is nn.MultiheadAttention:
            m.__class__ = AlibiMultiheadAttention  # m belongs to the copy
            m.register_buffer("alibi_slopes", alibi_slopes(m.num_heads), persistent=False)
            m.register_forward_pre_hook(_off_fast_path)
            changed.append(name)
            return m
        if callable(getattr(m, "set_attn_implementation", None)) and hasattr(m, "config"):
            hf_models.append(m)
        _longer_positions(m, max_len)
        return None

    new = replace_modules(module, policy)
    if names is not None and not names <= set(changed):
        raise ValueError(
            f"position_embeddings names {sorted(names - set(changed))} are not nn.Embedding "
            "modules of module"
        )
    for m in hf_models:
        _use_hf_alibi(m)
    if not changed and not hf_models:
        raise ValueError(
            "module has no nn.MultiheadAttention, transformers model or position embedding: "
            "ALiBi would change nothing"
        )
    return new


class Alibi(Algorithm, Surgery):
    """Composer's ``Alibi``: the surgery, plus shorter training rows on ``AFTER_DATALOADER``.

    ``model = alibi(model)`` returns a copy of the model with ALiBi attention and no learned
    position embeddings (the module passed in is not changed):

    * every ``nn.MultiheadAttention`` becomes an :class:`AlibiMultiheadAttention`;
    * every ``transformers`` ``PreTrainedModel`` inside switches to the ALiBi attention
      (registered as ``"sbfunc_alibi"`` with ``AttentionInterface``, with the eager additive
      masks; this registration is the one global effect);
    * every ``nn.Embedding`` named in ``position_embeddings`` (qualified names), or by default
      every ``nn.Embedding`` attribute called ``wpe`` or ``position_embeddings``, becomes a
      :class:`ZeroEmbedding` (its weight leaves the parameters: Composer zeroes and freezes
      it instead), and BERT-style ``position_ids``/``token_type_ids`` buffers are lengthened
      to ``max_sequence_length``.

    The bias is computed for each call's sequence lengths, so the model accepts sequences
    longer than its old position table (extrapolation).

    As an algorithm, on ``AFTER_DATALOADER`` it reshapes every batch of sequence length ``L``
    into rows of ``int(L * train_sequence_length_scaling)`` tokens (more rows, the same tokens:
    ``set_batch_sequence_length(..., truncate=False)``), which ALiBi's extrapolation makes
    harmless; the length is decided on the host from the batch's shape. It changes the
    sequence length (``changes_sequence_length``), so the default passes run it before
    Selective Backprop scores the batch.

    Args:
        max_sequence_length: the longest sequence the model will see, ``>= 1``.
        train_sequence_length_scaling: the training row length as a fraction of the batch's,
            in ``(0, 1]``; ``1`` matches no event.
        position_embeddings: qualified names of the embeddings to remove (default: see above).

    Raises:
        ValueError: for an argument out of range; calling it, if nothing in the module can take
            ALiBi, or a named embedding is missing.
        RuntimeError: calling it, for a ``transformers`` version without
            ``AttentionInterface``.

    Example:
        >>> from sbfunc.algorithms import Alibi
        >>> layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
        >>> type(Alibi(max_sequence_length=32)(layer).self_attn).__name__
        'AlibiMultiheadAttention'
        >>> alibi = Alibi(max_sequence_length=8, train_sequence_length_scaling=0.5)
        >>> batch = {"input_ids": torch.arange(8).view(1, 8)}
        >>> ctx = sbfunc.Context(sbfunc.random.key(0), batch=batch)
        >>> ctx = ctx.replace(matched=alibi.match(sbfunc.Event.AFTER_DATALOADER, ctx))
        >>> alibi.apply(sbfunc.Event.AFTER_DATALOADER, ctx).batch["input_ids"]
        tensor([[0, 1, 2, 3],
                [4, 5, 6, 7]])

    References:
        Press et al. 2022, "Train Short, Test Long"; MosaicML Composer ``Alibi`` and
        ``apply_alibi``.
    """

    uses_key = False  # deterministic: the engine derives no key for it
    changes_sequence_length = True

    def __init__(
        self,
        max_sequence_length: int,
        train_sequence_length_scaling: float = 0.25,
        *,
        position_embeddings: Sequence[str] | None = None,
    ) -> None:
        self.max_sequence_length = check_int(max_sequence_length, "max_sequence_length", low=1)
        self.scaling = check_real(
            train_sequence_length_scaling,
            "train_sequence_length_scaling",
            low=0.0,
            high=1.0,
            open_low=True,
        )
        self.position_embeddings = position_embeddings

    def __call__(self, module: nn.Module) -> nn.Module:
        names = self.position_embeddings
        return _alibi(
            module, self.max_sequence_length, None if names is None else frozenset(names)
        )

    events = frozenset({Event.AFTER_DATALOADER})

    def match(self, event: Event, ctx: Context) -> bool:
        return event == Event.AFTER_DATALOADER and self.scaling != 1.0

    def apply(self, event: Event, ctx: Context) -> Context:
        current = batch_sequence_length(ctx.batch)  # a shape: static in a compiled step
        if current is None:
            return ctx
        length = max(1, int(current * self.scaling))
        if length >= current:
            return ctx
        return ctx.replace(batch=set_batch_sequence_length(ctx.batch, length, truncate=False))

    def __repr__(self) -> str:
        return (
            f"Alibi(max_sequence_length={self.max_sequence_length}, "
            f"train_sequence_length_scaling={self.scaling})"
        )
