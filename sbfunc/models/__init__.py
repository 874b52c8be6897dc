"""Models that ship with sbfunc for its examples, tests and studies, in plain PyTorch.

* :class:`CausalLM`: a small GPT-style decoder-only transformer (about 0.66M parameters by
  default) for the byte-level corpus of :func:`sbfunc.datasets.stdlib_corpus`, built from
  ``nn.MultiheadAttention`` so that :class:`sbfunc.algorithms.Alibi`'s surgery applies; it
  returns the logits as a plain ``[N, L, V]`` tensor.

Its criterion is :data:`sbfunc.module.next_token_cross_entropy` (next-token cross-entropy of
unshifted labels, Hugging Face's convention).

Example:
    >>> from sbfunc.models import CausalLM
    >>> rows = sbfunc.datasets.byte_rows([b"import os\\nprint(os.sep)\\n"], 16)
    >>> model = CausalLM(d_model=32, num_heads=2, num_layers=1, max_len=16)
    >>> loss_fn = sbfunc.per_sample_loss(model, sbfunc.module.next_token_cross_entropy,
    ...                                  input=("input_ids", "attention_mask"), target="labels")
    >>> params, buffers = sbfunc.split_module(model)
    >>> loss_fn(params, buffers, rows).shape  # one loss per row, about log(257) at init
    torch.Size([2])
"""

from sbfunc._namespace import api_dir
from sbfunc.models._causal_lm import CausalLM

__all__ = ["CausalLM"]

__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
