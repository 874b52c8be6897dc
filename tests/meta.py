"""The ``meta`` device for the device tests: tensors with a shape and no data, where any host
read (``item``, ``bool``, ``tolist``, ``nonzero``, a copy to the CPU) or a device mix raises,
exactly where an accelerator would sync or fail. ``sync_site`` says where the read was."""

from __future__ import annotations

import traceback
from typing import Any

import optree
import pytest
import torch

META = torch.device("meta")
# the errors of a host read on meta (a device mix is a RuntimeError that matches none of them)
HOST_READ = r"cannot be called on meta tensors|Cannot copy out of meta tensor|nonzero"


def empty(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A meta tensor of ``shape``."""
    return torch.empty(*shape, dtype=dtype, device=META)


def to_meta(tree: Any) -> Any:
    """Every tensor of ``tree`` moved to ``meta``."""
    return optree.tree_map(lambda x: x.to(META) if isinstance(x, torch.Tensor) else x, tree)


def all_meta(tree: Any) -> bool:
    """Whether every tensor of ``tree`` is on ``meta``."""
    leaves = optree.tree_leaves(tree, none_is_leaf=False)
    return all(x.device == META for x in leaves if isinstance(x, torch.Tensor))


def host_read() -> Any:
    """``pytest.raises`` for a host read on ``meta`` (``with host_read() as error: ...``)."""
    return pytest.raises((RuntimeError, NotImplementedError), match=HOST_READ)


def sbfunc_frames(error: BaseException) -> list[tuple[str, str]]:
    """``(file under sbfunc/, function)`` of every sbfunc frame of ``error``, outermost
    first."""
    frames = traceback.extract_tb(error.__traceback__)
    return [(f.filename.split("sbfunc/")[-1], f.name) for f in frames if "/sbfunc/" in f.filename]


def sync_site(error: BaseException) -> tuple[str, str]:
    """The innermost sbfunc frame of ``error``: where the host read happened."""
    return sbfunc_frames(error)[-1]
