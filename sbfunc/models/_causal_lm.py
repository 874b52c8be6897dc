"""A small decoder-only transformer in plain PyTorch, for the byte-level corpus."""

from __future__ import annotations

import math

import torch
from torch import nn

from sbfunc import random as sbrandom
from sbfunc.validation import check_bool, check_fraction, check_int

__all__ = ["CausalLM"]

INIT_STD = 0.02
"""The standard deviation of the initial weights (GPT-2's)."""


class _Block(nn.Module):
    """A pre-LayerNorm decoder block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(self, d_model: int, num_heads: int, mlp_ratio: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = nn.MultiheadAttention(d_model, num_heads, dropout=dropout, batch_first=True)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, mlp_ratio * d_model),
            nn.GELU(),
            nn.Linear(mlp_ratio * d_model, d_model),
            nn.Dropout(dropout),
        )
        self.drop = nn.Dropout(dropout)

    def forward(
        self, x: torch.Tensor, causal: torch.Tensor, padding: torch.Tensor | None
    ) -> torch.Tensor:
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, key_padding_mask=padding, attn_mask=causal, need_weights=False)
        x = x + self.drop(a)
        return x + self.mlp(self.ln2(x))


def _initialise(model: nn.Module, key: sbrandom.Key, num_layers: int) -> None:
    """GPT-2's initialisation drawn from ``key``: weights ``N(0, 0.02)`` (the residual
    projections ``0.02 / sqrt(2 num_layers)``), biases 0, LayerNorm scales 1. Parameter ``i``
    (in ``named_parameters`` order) draws from ``fold_in(key, i)``."""
    residual = INIT_STD / math.sqrt(2 * num_layers)
    with torch.no_grad():
        for i, (name, p) in enumerate(model.named_parameters()):
            if p.dim() >= 2:
                std = residual if name.endswith(("out_proj.weight", "mlp.2.weight")) else INIT_STD
                p.copy_(sbrandom.normal(sbrandom.fold_in(key, i), tuple(p.shape)) * std)
            else:
                p.fill_(0.0 if name.endswith("bias") else 1.0)


class CausalLM(nn.Module):
    """A GPT-style decoder-only transformer: token and learned position embeddings,
    pre-LayerNorm blocks of ``nn.MultiheadAttention`` (causal) and a GELU MLP, a final
    LayerNorm and a linear head (tied to the token embedding by default).

    ``forward(input_ids, attention_mask=None)`` returns the logits, a plain ``[N, L,
    vocab_size]`` tensor (so ``sbfunc.per_sample_loss`` needs no ``output=``). Position ``t``
    attends to positions ``<= t`` whose ``attention_mask`` is 1 (the key-padding mask), so
    with right padding, as the datasets produce, the logits at real positions do not depend
    on the padding, and the other rows of a batch never matter. A row whose
    ``attention_mask`` is all 0 has no key to attend to; the model does not special-case it,
    and what it gives is ``nn.MultiheadAttention``'s: with torch 2.13, meaningless finite
    logits through the attention kernel used with grad (zeros out of the attention), NaN
    through the fused kernel of an eval-mode forward without grad (a softmax over nothing).
    A training step leaves such rows out before the forward (their labels are all ignored, so
    :data:`sbfunc.module.next_token_cross_entropy` has no real token in them). Left padding is
    not supported: the leading padded positions attend to nothing and, where they come out NaN,
    spoil the later positions.

    Because the attention is ``nn.MultiheadAttention`` and the position embedding an
    ``nn.Embedding`` named ``wpe``, :class:`sbfunc.algorithms.Alibi`'s surgery turns it into an
    ALiBi model (the position table becomes zeros and longer rows are accepted);
    ``position_embeddings=False`` builds it without one. Initial weights are GPT-2's, drawn
    from ``key`` (the global RNG is left as it was). The defaults have 660,736 parameters;
    one forward and backward of a batch of 32 x 128 bytes took about 0.2-0.3 s on 2 shared
    CPU cores (torch 2.13), so 500 such steps take a few minutes.

    Args:
        vocab_size: the number of token ids (``sbfunc.datasets.VOCAB_SIZE``, 257: the bytes
            and the padding id).
        d_model: the width, a multiple of ``num_heads``.
        num_heads: attention heads per block.
        num_layers: blocks.
        max_len: the longest row (rows of the position table).
        mlp_ratio: the MLP's hidden width over ``d_model``.
        dropout: dropout after the embeddings, inside the attention and on each residual
            branch, in ``[0, 1)``.
        tie_embeddings: use the token embedding as the output projection (no ``head``).
        position_embeddings: learn a position table ``wpe``; ``False`` has none (to train
            with ALiBi from the start).
        key: the initial weights' key (default ``sbfunc.random.key(0)``).

    Raises:
        ValueError: for a size outside its range or ``d_model`` not a multiple of
            ``num_heads``; at call time, for a row longer than ``max_len`` with a position
            table.

    Example:
        >>> from sbfunc.models import CausalLM
        >>> model = CausalLM(d_model=32, num_heads=2, num_layers=1, max_len=16)
        >>> ids = torch.tensor([[104, 105, 256, 256]])
        >>> logits = model(ids, attention_mask=torch.tensor([[1, 1, 0, 0]]))
        >>> logits.shape
        torch.Size([1, 4, 257])
        >>> bool(torch.allclose(logits[:, :2], model(ids[:, :2]), atol=1e-6))
        True

    References:
        Radford et al. 2019, "Language Models are Unsupervised Multitask Learners" (GPT-2:
        pre-LayerNorm blocks, tied embeddings, initialisation); Vaswani et al. 2017,
        "Attention Is All You Need"; Karpathy's nanoGPT.
    """

    wpe: nn.Module | None
    head: nn.Module | None

    def __init__(
        self,
        vocab_size: int = 257,
        d_model: int = 128,
        num_heads: int = 4,
        num_layers: int = 3,
        max_len: int = 256,
        *,
        mlp_ratio: int = 4,
        dropout: float = 0.0,
        tie_embeddings: bool = True,
        position_embeddings: bool = True,
        key: sbrandom.Key | None = None,
    ) -> None:
        super().__init__()
        self.vocab_size = check_int(vocab_size, "vocab_size", low=1)
        d_model = check_int(d_model, "d_model", low=1)
        num_heads = check_int(num_heads, "num_heads", low=1)
        if d_model % num_heads:
            raise ValueError(
                f"d_model must be a multiple of num_heads = {num_heads}, got {d_model}"
            )
        num_layers = check_int(num_layers, "num_layers", low=1)
        self.max_len = check_int(max_len, "max_len", low=1)
        mlp_ratio = check_int(mlp_ratio, "mlp_ratio", low=1)
        dropout = check_fraction(dropout, "dropout", open_high=True)
        self.tie_embeddings = check_bool(tie_embeddings, "tie_embeddings")
        with torch.random.fork_rng(devices=[]):  # the modules' own init draws
            self.wte = nn.Embedding(self.vocab_size, d_model)
            positions = check_bool(position_embeddings, "position_embeddings")
            self.wpe = nn.Embedding(self.max_len, d_model) if positions else None
            self.drop = nn.Dropout(dropout)
            block = [_Block(d_model, num_heads, mlp_ratio, dropout) for _ in range(num_layers)]
            self.blocks = nn.ModuleList(block)
            self.ln_f = nn.LayerNorm(d_model)
            tied = self.tie_embeddings
            self.head = None if tied else nn.Linear(d_model, self.vocab_size, bias=False)
        _initialise(self, sbrandom.key(0) if key is None else key, num_layers)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The logits ``[N, L, vocab_size]`` of ``input_ids`` ``[N, L]`` (int64); positions
        where ``attention_mask`` ``[N, L]`` is 0 are not attended to."""
        length = input_ids.shape[-1]
        x = self.wte(input_ids)
        positions = torch.arange(length, device=input_ids.device)
        if isinstance(self.wpe, nn.Embedding) and length > self.wpe.num_embeddings:
            raise ValueError(
                f"input_ids rows must have at most max_len = {self.wpe.num_embeddings} "
                f"tokens, got {length}; build the model with a larger max_len"
            )
        if self.wpe is not None:  # an nn.Embedding, or ALiBi's ZeroEmbedding
            x = x + self.wpe(positions)
        x = self.drop(x)
        causal = positions[None, :] > positions[:, None]  # True: not attended
        padding = None if attention_mask is None else attention_mask == 0
        for block in self.blocks:
            x = block(x, causal, padding)
        x = self.ln_f(x)
        return x @ self.wte.weight.T if self.head is None else self.head(x)
