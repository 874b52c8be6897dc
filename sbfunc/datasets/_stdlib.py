"""The text that ships with every Python install: the standard library's source files (code)
and the prose of ``pydoc_data.topics`` (English), read once per process.

The code is every ``*.py`` file under ``sysconfig.get_paths()["stdlib"]`` in the order of
their relative POSIX paths, leaving out directories that are not the standard library's own
code or that distributions strip or rewrite per machine: ``site-packages``,
``dist-packages``, ``__pycache__``, the test suites (``test``, ``tests``, ``idle_test``;
included on request), ``pydoc_data`` (the English text) and ``config-*``, and the files
``_sysconfigdata*`` (build paths of this machine).

Under a ``max_bytes`` limit the files are read in the order of the sha256 of their paths, a
fixed pseudo-random order that spreads the sample over the whole library (the sorted order
would give the packages starting with ``_``, ``a``, ..., ``e`` only, and ``encodings``' 122
generated code tables); a larger limit reads a superset. The files read are then kept in path
order.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import sysconfig
from typing import NamedTuple

__all__ = ["Sources", "english_text", "read_stdlib"]

_SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", "pydoc_data"})
_TEST_DIRS = frozenset({"test", "tests", "idle_test"})
_HEADING = re.compile(r"^[*=\-~^]+$")  # a reST heading underline


class Sources(NamedTuple):
    """The files read: relative POSIX paths, their bytes (the last one cut at ``max_bytes``)
    and the sha256 over both."""

    paths: tuple[str, ...]
    blobs: tuple[bytes, ...]
    digest: str


def _stdlib_root() -> str:
    return sysconfig.get_paths()["stdlib"]


def _code_paths(root: str, include_tests: bool) -> list[str]:
    """Every code file under ``root`` (relative POSIX paths), sorted."""
    skipped = _SKIPPED_DIRS if include_tests else _SKIPPED_DIRS | _TEST_DIRS
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in skipped and not d.startswith("config-")]
        rel = os.path.relpath(folder, root)
        for name in files:
            if name.endswith(".py") and not name.startswith("_sysconfigdata"):
                found.append(name if rel == "." else f"{rel}/{name}".replace(os.sep, "/"))
    return sorted(found)


def _hash(paths: tuple[str, ...], blobs: tuple[bytes, ...]) -> str:
    """sha256 over each file's path, length and bytes (unambiguous framing)."""
    h = hashlib.sha256()
    for path, blob in zip(paths, blobs, strict=True):
        h.update(f"{path}\0{len(blob)}\0".encode())
        h.update(blob)
    return h.hexdigest()


@functools.lru_cache(maxsize=8)
def read_stdlib(max_bytes: int, include_tests: bool) -> Sources:
    """The standard library's code files, in the order of their paths' sha256, until
    ``max_bytes`` bytes are read (the file crossing the limit is cut there), then sorted by
    path. Cached per process: read-only bytes.

    Example:
        >>> src = read_stdlib(1000, False)
        >>> sum(map(len, src.blobs)), len(src.digest)
        (1000, 64)
    """
    root = _stdlib_root()
    found = _code_paths(root, include_tests)
    read: dict[str, bytes] = {}
    left = max_bytes
    for path in sorted(found, key=lambda p: hashlib.sha256(p.encode()).digest()):
        if left <= 0:
            break
        with open(os.path.join(root, path), "rb") as f:
            blob = f.read(left)
        if blob:
            read[path] = blob
            left -= len(blob)
    paths = tuple(sorted(read))
    blobs = tuple(read[p] for p in paths)
    return Sources(paths, blobs, _hash(paths, blobs))


def _prose(text: str) -> str:
    """A topic's paragraphs without its indented blocks (grammar, code examples) and heading
    underlines."""
    lines = [
        line
        for line in text.splitlines()
        if not line.startswith("   ") and not _HEADING.match(line.strip())
    ]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


@functools.lru_cache(maxsize=1)
def english_text() -> bytes:
    """The English prose of ``pydoc_data.topics`` (the language reference's topics that
    ``help()`` shows), topics in name order, blank-line separated, UTF-8.

    Example:
        >>> len(english_text()) > 100_000
        True
    """
    from pydoc_data.topics import topics  # ships with CPython since 3.2

    return "\n\n".join(_prose(topics[name]) for name in sorted(topics)).encode("utf-8")
