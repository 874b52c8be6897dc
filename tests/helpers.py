"""Assertions and look-ups shared across the test packages."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

import optree
import torch


def same_leaf(a: Any, b: Any) -> bool:
    """Tensors: same dtype, shape and bytes (so NaN payloads and signed zeros count); other
    leaves: same type and ``==``, with NaN equal to NaN."""
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and (a.dtype, a.shape) == (b.dtype, b.shape)
            and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
        )
    return type(a) is type(b) and (a == b or (a != a and b != b))


def assert_identical(a: Any, b: Any) -> None:
    """Same pytree structure (``None`` a leaf) and every leaf the same bit for bit."""
    la, sa = optree.tree_flatten(a, none_is_leaf=True)
    lb, sb = optree.tree_flatten(b, none_is_leaf=True)
    assert sa == sb
    for x, y in zip(la, lb, strict=True):
        assert same_leaf(x, y), (x, y)


def tiny_lm(length: int, *, layers: int = 1, seed: int = 0) -> Any:
    """A tiny :class:`sbfunc.models.CausalLM` for rows of ``length`` bytes."""
    import sbfunc

    return sbfunc.models.CausalLM(
        d_model=16, num_heads=2, num_layers=layers, max_len=length, key=sbfunc.random.key(seed)
    )


def lm_loss(model: Any) -> Any:
    """The next-token loss of a causal LM on ``{"input_ids", "attention_mask", "labels"}``."""
    import sbfunc

    return sbfunc.per_sample_loss(
        model, sbfunc.module.next_token_cross_entropy, input=("input_ids", "attention_mask"),
        target="labels",
    )  # fmt: skip


def resolve_face(dotted: str) -> Any:
    """The module ``dotted`` names, or the namespace of a gone one (``sbfunc.passes``), got
    without its warning."""
    module: Any = importlib.import_module("sbfunc")
    for i, part in enumerate(dotted.split(".")[1:], start=2):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            found = getattr(module, part, None)
        module = (
            found
            if found is not None
            else importlib.import_module(".".join(dotted.split(".")[:i]))
        )
    return module


def split(chunks: int | None = None, size: int | None = None) -> Any:
    """``make_train_step``'s ``microbatching=``: a :class:`sbfunc.step.Microbatching` of
    ``chunks`` or ``size`` rows, ``None`` for neither."""
    import sbfunc

    if chunks is None and size is None:
        return None
    return sbfunc.step.Microbatching(chunks=chunks, size=size)
