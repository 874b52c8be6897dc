"""Assertions shared across the test packages."""

from __future__ import annotations

from typing import Any

import optree
import torch


def assert_identical(a: Any, b: Any) -> None:
    """Same pytree structure (``None`` a leaf), every tensor leaf equal bit for bit with the
    same dtype, every other leaf ``==``."""
    la, sa = optree.tree_flatten(a, none_is_leaf=True)
    lb, sb = optree.tree_flatten(b, none_is_leaf=True)
    assert sa == sb
    for x, y in zip(la, lb, strict=True):
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and torch.equal(x, y)
        else:
            assert x == y
