"""Checkpoints of any pytree state: ``torch.load(weights_only=True)``-safe, checked, atomic.

``torch.load(..., weights_only=True)`` refuses arbitrary classes (the NamedTuple states of
sbfunc, its optimizers and user algorithms). A checkpoint therefore holds plain data only: the flat
list of leaves (tensors, ints, floats, bools, strings, ``None``), a record of the tree's nodes
and a digest. :func:`load` rebuilds the tree from a *template* ``like`` (e.g. a freshly
initialised state), so every class comes from your code, never from the file.

What :func:`load` checks, in order; any failure raises :class:`CheckpointError` (a
``ValueError``) whose message names the file:

1. the file reads with ``torch.load(weights_only=True)`` (a truncated or mangled file fails
   here) and holds an sbfunc checkpoint;
2. integrity: the SHA-256 digest written at save time equals the one recomputed from what was
   read (the structure, the node record, every tensor's dtype, shape and bytes, every other
   leaf's type and ``repr``);
3. structure: the checkpoint has exactly the template's nodes; a mismatch lists each path that
   is only in the checkpoint, only in the template, or a node of another type;
4. leaves: each tensor has the template's dtype and shape, except that a template dimension of
   size 0 matches any size (a growable buffer, such as the refill queue, starts empty); each
   other leaf has the template's type (a time counter may hold any ``int``). Every mismatch is
   listed (up to 20) with its path.

The digest detects accidental damage (truncation, flipped bits, a file half-overwritten by
another program); it is not a signature. The template's leaf values and devices are ignored;
tensors come back on the device they were saved from, or ``map_location``.

:func:`save` to a path is atomic: if the save raises or the process dies, ``NAME`` holds either
the previous checkpoint or the new one, complete (a hard kill can leave a temporary
``.NAME.<random>.tmp`` behind; it is safe to delete). Saving to a file object simply writes to
it. What the digest covers and how the atomic write works: ``docs/how-to/failures.md``.

The format is ``sbfunc.checkpoint/2``. Version-1 files (no digest, no node record) still load,
with a warning: their integrity is not checked and a structure mismatch prints both structures
instead of a diff. Saving them again upgrades them.

Example:
    >>> import io
    >>> buf = io.BytesIO()
    >>> state = {"params": {"0.weight": torch.ones(2, 3)}, "step": 4}
    >>> sbfunc.checkpoint.save(state, buf)
    >>> wider = {"params": {"0.weight": torch.zeros(2, 3), "2.weight": torch.zeros(1)}, "step": 0}
    >>> sbfunc.checkpoint.load(io.BytesIO(buf.getvalue()), like=wider)
    Traceback (most recent call last):
    ...
    sbfunc.checkpoint.CheckpointError: checkpoint <BytesIO>: structure does not match the
    template `like` (1 difference):
      ['params']['2.weight']: missing from the checkpoint
    >>> sbfunc.checkpoint.load(io.BytesIO(buf.getvalue()), like={**wider, "params": {
    ...     "0.weight": torch.zeros(3, 3, dtype=torch.float64)}})
    Traceback (most recent call last):
    ...
    sbfunc.checkpoint.CheckpointError: checkpoint <BytesIO>: 1 leaf does not match the template
    `like`:
      ['params']['0.weight']: float32 tensor of shape (2, 3) in the checkpoint, float64 tensor of
      shape (3, 3) in the template
    >>> data = bytearray(buf.getvalue())
    >>> data[data.index(b"\\x00\\x00\\x80?")] ^= 1  # one bit of a weight: 1.0 -> 1.0000001
    >>> sbfunc.checkpoint.load(io.BytesIO(data), like=state)
    Traceback (most recent call last):
    ...
    sbfunc.checkpoint.CheckpointError: checkpoint <BytesIO> is corrupt: its contents do not match
    the sha256 digest written when it was saved
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import warnings
from collections.abc import Callable
from typing import IO, Any, TypeVar

import optree
import torch

from sbfunc import _checkpoint_checks as checks
from sbfunc._namespace import api_dir

__all__ = ["CheckpointError", "from_state_dict", "load", "save", "to_state_dict"]

T = TypeVar("T")
FORMAT = "sbfunc.checkpoint/2"
_FORMAT_V1 = "sbfunc.checkpoint/1"


class CheckpointError(ValueError):
    """A checkpoint that cannot be restored: unreadable, corrupt, or unlike the template.

    The message names the file (or ``<BytesIO>``, ``<state dict>``) and what failed: the read,
    the digest, the structure (every differing path) or the leaves (every differing leaf with
    both shapes, dtypes or types).

    Example:
        >>> import io
        >>> sbfunc.checkpoint.load(io.BytesIO(b"not a checkpoint"), like={})
        Traceback (most recent call last):
        ...
        sbfunc.checkpoint.CheckpointError: checkpoint <BytesIO> is unreadable (truncated, corrupt,
        or not a file that torch.load(weights_only=True) accepts): ...
        >>> issubclass(sbfunc.checkpoint.CheckpointError, ValueError)
        True

    References:
        Orbax ``CheckpointManager`` restore errors (structure and shape checks against a target
        tree); PyTorch ``torch.load(weights_only=True)``.
    """


def to_state_dict(tree: Any) -> dict[str, Any]:
    """Flatten a pytree into a ``weights_only``-safe dict: leaves, structure, nodes, digest.

    Args:
        tree: any optree pytree (dicts, tuples, lists, NamedTuples, ``None``); its leaves are
            tensors on any device or Python scalars and strings.

    Returns:
        ``{"format", "structure", "nodes", "leaves", "digest"}``: ``leaves`` in optree order,
        ``nodes`` the ``(path, type, parent)`` record that :func:`load` diffs against a
        template, ``digest`` a ``"sha256:..."`` string over all of it.

    Example:
        >>> d = sbfunc.checkpoint.to_state_dict({"w": torch.ones(2), "step": 3})
        >>> d["format"], d["leaves"], d["nodes"]
        ('sbfunc.checkpoint/2', [3, tensor([1., 1.])], [('', 'dict', -1), ("['step']", '*', 0),
         ("['w']", '*', 0)])
        >>> d["digest"][:7]
        'sha256:'

    References:
        optree ``tree_flatten(none_is_leaf=True)``; Flax ``flax.serialization.to_state_dict``;
        PyTorch ``torch.load(weights_only=True)``.
    """
    leaves, spec = optree.tree_flatten(tree, none_is_leaf=True)
    structure, nodes = str(spec), checks.node_record(spec)
    digest = checks.digest(FORMAT, structure, nodes, leaves)
    return {
        "format": FORMAT,
        "structure": structure,
        "nodes": nodes,
        "leaves": leaves,
        "digest": digest,
    }


def from_state_dict(d: dict[str, Any], like: T) -> T:
    """Rebuild a pytree from :func:`to_state_dict` output, checked against the template ``like``.

    Args:
        d: the dict, e.g. from ``torch.load(..., weights_only=True)``.
        like: a template with the expected structure, dtypes and shapes (e.g. a freshly
            initialised state); its leaf values are ignored.

    Returns:
        A tree of ``like``'s structure and classes holding ``d``'s leaves.

    Raises:
        CheckpointError: if ``d`` is not an sbfunc checkpoint, fails its digest, or differs from
            ``like`` in structure or leaves (see the module docstring).

    Example:
        >>> d = sbfunc.checkpoint.to_state_dict({"w": torch.ones(2), "step": 3})
        >>> sbfunc.checkpoint.from_state_dict(d, {"w": torch.zeros(2), "step": 0})
        {'w': tensor([1., 1.]), 'step': 3}

    References:
        optree ``tree_unflatten``; Flax ``flax.serialization.from_state_dict(target, state)``
        (the template comes first there).
    """
    return _restore(d, like, "<state dict>")


def save(tree: Any, f: str | os.PathLike[str] | IO[bytes]) -> None:
    """Save a pytree (a train state) in a ``torch.load(weights_only=True)``-loadable form.

    Saving to a path is atomic (temporary file, ``fsync``, ``os.replace``; see the module
    docstring): an interrupted save leaves the previous file intact.

    Args:
        tree: any pytree accepted by :func:`to_state_dict`.
        f: a path, or a binary file object opened for writing.

    Raises:
        TypeError: if ``f`` is neither a path nor writable.

    Example:
        >>> import io
        >>> buf = io.BytesIO()
        >>> sbfunc.checkpoint.save({"w": torch.ones(2)}, buf)
        >>> _ = buf.seek(0)
        >>> sbfunc.checkpoint.load(buf, like={"w": torch.zeros(2)})
        {'w': tensor([1., 1.])}

    References:
        PyTorch ``torch.save``; POSIX ``rename(2)`` and ``fsync(2)`` (the write-then-rename
        pattern of atomic file replacement).
    """
    if not isinstance(f, (str, os.PathLike)) and not hasattr(f, "write"):
        raise TypeError(f"f must be a path or a writable binary file, got {type(f).__name__}")
    d = to_state_dict(tree)
    if isinstance(f, (str, os.PathLike)):
        _atomic_write(os.fspath(f), lambda fh: torch.save(d, fh))
    else:
        torch.save(d, f)


def load(
    f: str | os.PathLike[str] | IO[bytes],
    like: T,
    *,
    map_location: str | torch.device | None = None,
) -> T:
    """Load a pytree saved by :func:`save` with ``torch.load(weights_only=True)`` and check it.

    Args:
        f: a path, or a binary file object opened for reading (e.g. ``io.BytesIO``).
        like: a template with the expected structure, dtypes and shapes (e.g. a freshly
            initialised state); its leaf values and devices are ignored.
        map_location: passed to ``torch.load``.

    Returns:
        A tree of ``like``'s structure and classes holding the checkpoint's leaves.

    Raises:
        TypeError: if ``f`` is neither a path nor readable.
        FileNotFoundError: (and other ``OSError``) if the path cannot be opened.
        CheckpointError: if the file is truncated, corrupt (digest mismatch) or not an sbfunc
            checkpoint, or differs from ``like`` in structure or leaves; the message names the
            file and lists every difference.

    Example:
        >>> import io
        >>> buf = io.BytesIO()
        >>> sbfunc.checkpoint.save({"step": 7, "w": torch.ones(2)}, buf)
        >>> _ = buf.seek(0)
        >>> sbfunc.checkpoint.load(buf, like={"step": 0, "w": torch.zeros(2)})
        {'step': 7, 'w': tensor([1., 1.])}
        >>> _ = buf.seek(0)
        >>> sbfunc.checkpoint.load(buf, like={"step": 0.0, "w": torch.zeros(2, dtype=torch.int64)})
        Traceback (most recent call last):
        ...
        sbfunc.checkpoint.CheckpointError: checkpoint <BytesIO>: 2 leaves do not match the
        template `like`:
          ['step']: int in the checkpoint, float in the template
          ['w']: float32 tensor of shape (2,) in the checkpoint, int64 tensor of shape (2,) in the
          template

    References:
        PyTorch ``torch.load(weights_only=True)``; Flax ``flax.serialization.from_bytes(target,
        ...)`` (restores into a template); Orbax (shape and dtype checks against a target).
    """
    if isinstance(f, (str, os.PathLike)):
        source = repr(os.fspath(f))
        with open(f, "rb") as fh:
            d = _read(fh, source, map_location)
    elif hasattr(f, "read"):
        name = getattr(f, "name", None)
        source = repr(name) if isinstance(name, str) else f"<{type(f).__name__}>"
        d = _read(f, source, map_location)
    else:
        raise TypeError(f"f must be a path or a readable binary file, got {type(f).__name__}")
    return _restore(d, like, source)


def _read(fh: IO[bytes], source: str, map_location: str | torch.device | None) -> Any:
    try:
        return torch.load(fh, map_location=map_location, weights_only=True)
    except Exception as e:
        raise CheckpointError(
            f"checkpoint {source} is unreadable (truncated, corrupt, or not a file that "
            f"torch.load(weights_only=True) accepts): it failed with {type(e).__name__}: {e}"
        ) from e


def _restore(d: Any, like: T, source: str) -> T:
    """Validate ``d`` (format, digest, structure, leaves) and rebuild it in ``like``'s shape."""
    fmt = d.get("format") if isinstance(d, dict) else None
    if fmt not in (FORMAT, _FORMAT_V1):
        got = f"format {fmt!r}" if isinstance(d, dict) else f"a {type(d).__name__}"
        raise CheckpointError(
            f"checkpoint {source} is not an sbfunc checkpoint: expected a dict with format "
            f"{FORMAT!r} (or {_FORMAT_V1!r}), got {got}"
        )
    fields = {"structure": str, "leaves": list}
    if fmt == FORMAT:
        fields.update(nodes=list, digest=str)
    for key, kind in fields.items():
        if not isinstance(d.get(key), kind):
            raise CheckpointError(
                f"checkpoint {source} is corrupt: its {key!r} is missing or not a {kind.__name__}"
            )
    if fmt == FORMAT:
        if checks.digest(fmt, d["structure"], d["nodes"], d["leaves"]) != d["digest"]:
            raise CheckpointError(
                f"checkpoint {source} is corrupt: its contents do not match the sha256 digest "
                "written when it was saved"
            )
    else:
        warnings.warn(
            f"checkpoint {source} is in format {_FORMAT_V1!r}: it has no digest, so its "
            "integrity is not checked; save it again to upgrade it",
            UserWarning,
            stacklevel=3,
        )
    template_leaves: list[Any]
    template_leaves, spec = optree.tree_flatten(like, none_is_leaf=True)  # type: ignore[arg-type]
    nodes = checks.node_record(spec)
    if d["structure"] != str(spec):
        problems = checks.structure_problems(d["nodes"], nodes) if fmt == FORMAT else []
        if not problems:  # v1, or a difference the node record does not show
            problems = [f"checkpoint: {d['structure']}", f"template:   {spec}"]
        raise CheckpointError(
            f"checkpoint {source}: structure does not match the template `like` "
            f"({checks.count(problems, 'difference')}):{checks.listing(problems)}"
        )
    if len(d["leaves"]) != spec.num_leaves:  # only reachable for version-1 files
        raise CheckpointError(f"checkpoint {source} is corrupt: wrong number of leaves")
    problems = checks.leaf_problems(nodes, d["leaves"], template_leaves)
    if problems:
        verb = "does" if len(problems) == 1 else "do"
        raise CheckpointError(
            f"checkpoint {source}: {checks.count(problems, 'leaf')} {verb} not match the "
            f"template `like`:{checks.listing(problems)}"
        )
    return optree.tree_unflatten(spec, d["leaves"])  # type: ignore[return-value]


def _atomic_write(path: str, write: Callable[[IO[bytes]], None]) -> None:
    """Write through a temporary file in ``path``'s folder, fsync, then rename over ``path``."""
    path = os.path.realpath(path)  # through a symlink, like ``open(path, "wb")`` would
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{secrets.token_hex(4)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    fd = os.open(tmp, flags, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            if os.chmod in os.supports_fd:  # keep the mode of the file it replaces
                with contextlib.suppress(FileNotFoundError):
                    os.chmod(fh.fileno(), stat.S_IMODE(os.stat(path).st_mode))
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if os.name == "posix":  # make the rename itself durable
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            with contextlib.suppress(OSError):  # some file systems refuse to fsync a folder
                os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
