"""The checks behind :mod:`sbfunc.checkpoint`: node records, structure and leaf diffs, digest.

Private: the public behaviour is documented in :mod:`sbfunc.checkpoint`. A *node record* lists
every node of a pytree in preorder as ``(path, type name or "*", parent index)``; paths read
like Python accessors from the root (``params['0.weight']``, ``opt_state[0].mu``), with a
top-level NamedTuple's fields written bare.
"""

from __future__ import annotations

import hashlib
from typing import Any

import optree
import torch

LEAF = "*"  # the node label of a leaf (optree prints leaves as ``*``)
MAX_REPORTED = 20
Node = tuple[str, str, int]


def node_record(spec: Any) -> list[Node]:
    """Every node of the treespec ``spec`` in preorder as ``(path, type or '*', parent)``.

    Example:
        >>> from typing import NamedTuple
        >>> import optree
        >>> class S(NamedTuple):
        ...     params: dict
        ...     step: int
        >>> node_record(optree.tree_structure(S({"w": 1}, 0)))
        [('', 'S', -1), ('params', 'dict', 0), ("params['w']", '*', 1), ('step', '*', 0)]
    """
    out: list[Node] = []

    def walk(s: Any, path: str, parent: int) -> None:
        index = len(out)
        if s.is_leaf():
            out.append((path, LEAF, parent))
            return
        kind = s.type
        out.append((path, kind.__qualname__, parent))
        if optree.is_namedtuple_class(kind):
            names = [f".{field}" for field in kind._fields]
        elif optree.is_structseq_class(kind):
            names = [f".{field}" for field in optree.structseq_fields(kind)]
        else:
            names = [f"[{entry!r}]" for entry in s.entries()]
        for name, child in zip(names, s.children(), strict=True):
            walk(child, path + name if path or name[0] != "." else name[1:], index)

    walk(spec, "", -1)
    return out


def structure_problems(stored: list[Any], template: list[Node]) -> list[str]:
    """The topmost paths only in the checkpoint, only in the template, or of another type."""

    def table(nodes: list[Any]) -> dict[str, tuple[str, str | None]]:
        return {p: (label, nodes[i][0] if i >= 0 else None) for p, label, i in nodes}

    ours, theirs = table(stored), table(template)
    reported: set[str] = set()
    problems = []
    for path, (_, parent) in [*ours.items(), *theirs.items()]:
        if path in reported or (
            path in ours and path in theirs and ours[path][0] == theirs[path][0]
        ):
            continue
        reported.add(path)
        if parent in reported:
            continue  # inside a subtree already reported
        if path not in theirs:
            problems.append(f"{_show(path)}: missing from the template")
        elif path not in ours:
            problems.append(f"{_show(path)}: missing from the checkpoint")
        else:
            problems.append(
                f"{_show(path)}: {_label(ours[path][0])} in the checkpoint, "
                f"{_label(theirs[path][0])} in the template"
            )
    return problems


def leaf_problems(nodes: list[Node], got: list[Any], want: list[Any]) -> list[str]:
    """One line per leaf of ``got`` unlike the template's leaf at the same path."""
    paths = [path for path, label, _ in nodes if label == LEAF]
    return [
        f"{_show(path)}: {_kind(g)} in the checkpoint, {_kind(w)} in the template"
        for path, g, w in zip(paths, got, want, strict=True)
        if not (_leaf_matches(g, w) or _optional_length(_show(path), g, w))
    ]


def _optional_length(path: str, got: Any, want: Any) -> bool:
    """``time.total_steps`` is the run's length or ``None`` while unknown: a template built
    without it (``step.init`` with no ``total_steps``) takes the checkpoint's, and back."""
    optional = (type(None), int)
    return path.endswith("total_steps") and type(got) in optional and type(want) in optional


def _leaf_matches(got: Any, want: Any) -> bool:
    """Tensors: same dtype and rank, same sizes except where the template's is 0; else: type."""
    if isinstance(want, torch.Tensor):
        return (
            isinstance(got, torch.Tensor)
            and got.dtype == want.dtype
            and got.dim() == want.dim()
            and all(w in (0, g) for g, w in zip(got.shape, want.shape, strict=True))
        )
    return type(got) is type(want)


def _kind(leaf: Any) -> str:
    """What a leaf is, for a mismatch: a tensor's dtype and shape, else its type."""
    if isinstance(leaf, torch.Tensor):
        return f"{str(leaf.dtype).removeprefix('torch.')} tensor of shape {tuple(leaf.shape)}"
    return "None" if leaf is None else type(leaf).__name__


def _label(label: str) -> str:
    return "leaf" if label == LEAF else label


def _show(path: str) -> str:
    return path or "<root>"


def count(problems: list[str], noun: str) -> str:
    """``"1 leaf"``, ``"3 leaves"``, ``"2 differences"``."""
    n = len(problems)
    return f"{n} {noun}" if n == 1 else f"{n} {'leaves' if noun == 'leaf' else noun + 's'}"


def listing(problems: list[str]) -> str:
    """The problems one per indented line, the first :data:`MAX_REPORTED` of them."""
    shown = problems[:MAX_REPORTED]
    more = len(problems) - len(shown)
    return "".join(f"\n  {p}" for p in shown) + (f"\n  ... and {more} more" if more else "")


def digest(fmt: str, structure: str, nodes: list[Any], leaves: list[Any]) -> str:
    """``"sha256:<hex>"`` over the format, structure, node record and leaves, length-prefixed.

    A tensor contributes its dtype, shape and element bytes (never its device, strides or
    ``requires_grad``); any other leaf its type and ``repr``.
    """
    h = hashlib.sha256()

    def put(chunk: bytes | memoryview) -> None:
        h.update(len(chunk).to_bytes(8, "little"))
        h.update(chunk)

    for text in (fmt, structure, repr(nodes)):
        put(text.encode())
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            put(f"tensor {leaf.dtype} {tuple(leaf.shape)}".encode())
            put(_tensor_bytes(leaf))
        else:
            put(f"{type(leaf).__module__}.{type(leaf).__qualname__} {leaf!r}".encode())
    return "sha256:" + h.hexdigest()


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    """The elements' bytes in row-major order (a host copy only when not contiguous on CPU).

    A device-to-host copy by design: checkpoints are written and digested on the host, once
    per save, never inside a training step."""
    t = t.detach()
    if t.layout != torch.strided:
        t = t.to_dense()
    flat = t.resolve_conj().resolve_neg().cpu().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().data
