"""A byte-level text corpus that ships with Python: the standard library's source code, cut
into fixed-length rows for a causal language model, a split by file, and a mixed stream of
code, random bytes and English prose.

Rows are dicts of tensors (Hugging Face's causal-LM batch): ``input_ids`` ``[S, L]`` int64
bytes ``0..255`` with :data:`PAD_ID` after the end of a document, ``attention_mask``
``[S, L]`` int64 (1 on the document's bytes, 0 on padding), ``labels`` ``[S, L]`` int64,
``ids`` ``[S]`` int64 and ``kind`` ``[S]`` int64 (:data:`KINDS`).

**Labels are not shifted**, as Hugging Face causal LMs expect: ``labels`` equals
``input_ids`` with :data:`IGNORE_INDEX` (``-100``) on padding, and the loss shifts (the
logits at ``t`` predict ``labels[t + 1]``: :data:`sbfunc.module.next_token_cross_entropy`,
``transformers``' ``ForCausalLMLoss``). Padding is on the right, so a causal model's outputs
at real positions never see it.
"""

from __future__ import annotations

import hashlib
import platform
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch

from sbfunc import random as sbrandom
from sbfunc.batch import take
from sbfunc.datasets._arrays import num_rows
from sbfunc.datasets._stdlib import english_text, read_stdlib
from sbfunc.validation import check_fraction, check_int

__all__ = [
    "IGNORE_INDEX",
    "KINDS",
    "PAD_ID",
    "VOCAB_SIZE",
    "TextCorpus",
    "TextSplit",
    "byte_rows",
    "split_corpus",
    "stdlib_corpus",
]

PAD_ID = 256
"""The padding token: one past the 256 byte values."""
VOCAB_SIZE = 257
"""Token ids of the byte-level corpus: the 256 bytes and :data:`PAD_ID`."""
IGNORE_INDEX = -100
"""The label of a padded position (``F.cross_entropy``'s default ``ignore_index``)."""
KINDS = ("code", "random", "english")
"""The meaning of a row's ``kind``: 0 clean code, 1 uniformly random bytes, 2 English prose."""
_FORMAT = "sbfunc.stdlib_corpus/1"  # bump when the rows built from the same bytes change


class TextCorpus(NamedTuple):
    """The standard library's code as byte-level rows, with what names the data.

    Attributes:
        rows: the code rows (see the module: ``input_ids``, ``attention_mask``, ``labels``
            ``[S, L]``, ``ids`` = ``arange(S)``, ``kind`` all 0).
        english: the English prose, a 1-D int64 tensor of bytes (``pydoc_data.topics``
            without its code blocks), for :func:`mixed_stream`.
        files: ``[S]`` int64, the index in ``paths`` of the file each row comes from.
        paths: the files read, relative POSIX paths under the standard library, sorted.
        digest: sha256 (hex) of the format, ``seq_len``, every file's path and bytes used and
            the English text: equal digests mean equal rows.
        python_version: the interpreter whose standard library this is, such as ``"3.11.7"``.
        num_bytes: the bytes of code read (at most ``max_bytes``).

    Example:
        >>> corpus = sbfunc.datasets.stdlib_corpus(seq_len=16, max_bytes=1000)
        >>> corpus.num_bytes, sorted(corpus.rows), corpus.files.shape == corpus.rows["ids"].shape
        (1000, ['attention_mask', 'ids', 'input_ids', 'kind', 'labels'], True)

    References:
        The Python standard library; Hugging Face ``transformers`` causal-LM batches.
    """

    rows: dict[str, torch.Tensor]
    english: torch.Tensor
    files: torch.Tensor
    paths: tuple[str, ...]
    digest: str
    python_version: str
    num_bytes: int


class TextSplit(NamedTuple):
    """Disjoint row sets of one corpus, each a rows dict (see :class:`TextCorpus`); no file
    has rows in two of them. Built by :func:`split_corpus`.

    Example:
        >>> corpus = sbfunc.datasets.stdlib_corpus(seq_len=16, max_bytes=5000)
        >>> parts = sbfunc.datasets.split_corpus(corpus, heldout=0.5, key=sbfunc.random.key(0))
        >>> parts._fields, len(parts.reference["ids"])
        (('train', 'heldout', 'reference'), 0)

    References:
        Mindermann et al. 2022 (RHO-LOSS: train, holdout and test sets).
    """

    train: dict[str, torch.Tensor]
    heldout: dict[str, torch.Tensor]
    reference: dict[str, torch.Tensor]


def _tokens(documents: Sequence[bytes]) -> torch.Tensor:
    """All documents' bytes, concatenated, as an int64 tensor."""
    joined = bytearray(b"".join(documents))
    if not joined:
        return torch.zeros(0, dtype=torch.int64)
    return torch.frombuffer(joined, dtype=torch.uint8).to(torch.int64)


def _chunks(sizes: Sequence[int], seq_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(start, length, document)`` of every row: each document cut every ``seq_len`` bytes,
    leaving out a last piece of fewer than 2 bytes (it has no next byte to predict)."""
    starts, lengths, docs = [], [], []
    offset = 0
    for doc, size in enumerate(sizes):
        for begin in range(0, size, seq_len):
            piece = min(seq_len, size - begin)
            if piece >= 2:
                starts.append(offset + begin)
                lengths.append(piece)
                docs.append(doc)
        offset += size
    start, length, doc_index = (
        torch.tensor(v, dtype=torch.int64) for v in (starts, lengths, docs)
    )
    return start, length, doc_index


def _rows(
    tokens: torch.Tensor, start: torch.Tensor, length: torch.Tensor, seq_len: int
) -> dict[str, torch.Tensor]:
    """Rows of ``seq_len`` tokens from ``tokens[start : start + length]``, right-padded."""
    position = torch.arange(seq_len)
    real = position < length[:, None]
    index = (start[:, None] + position).clamp(max=max(tokens.numel() - 1, 0))
    input_ids = torch.where(real, tokens[index], PAD_ID)  # no rows when there are no tokens
    n = start.shape[0]
    return {
        "input_ids": input_ids,
        "attention_mask": real.to(torch.int64),
        "labels": torch.where(real, input_ids, IGNORE_INDEX),
        "ids": torch.arange(n, dtype=torch.int64),
        "kind": torch.zeros(n, dtype=torch.int64),
    }


def byte_rows(documents: Sequence[bytes], seq_len: int) -> dict[str, torch.Tensor]:
    """Byte-level causal-LM rows of ``documents``: each cut every ``seq_len`` bytes, its last
    piece right-padded (a last piece of one byte is left out: it has no next byte).

    Args:
        documents: the texts, as bytes (``str.encode()``).
        seq_len: the row length, ``>= 2``.

    Returns:
        The rows dict (see the module): ``input_ids``, ``attention_mask``, ``labels`` (not
        shifted, :data:`IGNORE_INDEX` on padding), ``ids`` = ``arange(S)``, ``kind`` all 0.

    Raises:
        ValueError: if ``seq_len < 2``.

    Example:
        >>> rows = sbfunc.datasets.byte_rows([b"abcde", b"xy"], 4)
        >>> rows["input_ids"]
        tensor([[ 97,  98,  99, 100],
                [120, 121, 256, 256]])
        >>> rows["labels"][1], rows["attention_mask"][1]
        (tensor([ 120,  121, -100, -100]), tensor([1, 1, 0, 0]))

    References:
        Radford et al. 2019, GPT-2 (byte-level modelling); Hugging Face ``transformers``
        causal-LM labels (``labels = input_ids``, ``-100`` ignored, shifted in the loss).
    """
    seq_len = check_int(seq_len, "seq_len", low=2, fix="a row needs a byte and its successor")
    start, length, _ = _chunks([len(d) for d in documents], seq_len)
    return _rows(_tokens(documents), start, length, seq_len)


def _corpus_digest(code_digest: str, english: bytes, seq_len: int) -> str:
    h = hashlib.sha256(f"{_FORMAT}\0{seq_len}\0{code_digest}\0".encode())
    h.update(hashlib.sha256(english).digest())
    return h.hexdigest()


def stdlib_corpus(
    *, seq_len: int = 128, max_bytes: int = 4 * 2**20, include_tests: bool = False
) -> TextCorpus:
    """The running interpreter's standard library source as byte-level causal-LM rows.

    The ``*.py`` files under ``sysconfig.get_paths()["stdlib"]`` are read in a fixed
    pseudo-random order (by the sha256 of their paths, so a limited read samples the whole
    library) until ``max_bytes`` bytes (the file crossing the limit is cut), and kept in path
    order, leaving out ``site-packages``, ``__pycache__``, ``pydoc_data``, ``config-*``,
    ``_sysconfigdata*`` and, unless ``include_tests``, the test suites (``test``, ``tests``,
    ``idle_test``: distributions often ship them apart). Each file is cut into rows with
    :func:`byte_rows`, so rows never span two files and a file's last row is padded.
    Nothing is downloaded or written; the bytes are read once per process (about 0.2 s for
    4 MiB) and every call builds new tensors.

    The record names its data: ``digest`` changes with the Python version's sources,
    ``max_bytes``, ``include_tests`` and ``seq_len``, and ``python_version`` says which
    interpreter it came from. On CPython 3.11.7 the default reads 4 MiB from 294 of the 728
    code files (11.3 MB without the tests): 32,903 rows of 128 bytes, 0.4% of them padding.

    Args:
        seq_len: the row length, ``>= 2``.
        max_bytes: the most bytes of code read, ``>= 1``.
        include_tests: also read the test suites.

    Returns:
        A :class:`TextCorpus`.

    Raises:
        ValueError: for ``seq_len < 2`` or ``max_bytes < 1``.

    Example:
        >>> corpus = sbfunc.datasets.stdlib_corpus(seq_len=64, max_bytes=20_000)
        >>> rows = corpus.rows
        >>> rows["input_ids"].shape[1], rows["input_ids"].dtype, corpus.num_bytes
        (64, torch.int64, 20000)
        >>> bool(((rows["labels"] == -100) == (rows["attention_mask"] == 0)).all())
        True
        >>> len(corpus.digest), corpus.python_version == __import__("platform").python_version()
        (64, True)

    References:
        The Python standard library (``sysconfig``'s ``stdlib`` path); Radford et al. 2019,
        GPT-2 (byte-level modelling).
    """
    seq_len = check_int(seq_len, "seq_len", low=2, fix="a row needs a byte and its successor")
    max_bytes = check_int(max_bytes, "max_bytes", low=1)
    source = read_stdlib(max_bytes, bool(include_tests))
    start, length, files = _chunks([len(b) for b in source.blobs], seq_len)
    english = english_text()
    return TextCorpus(
        rows=_rows(_tokens(source.blobs), start, length, seq_len),
        english=_tokens([english]),
        files=files,
        paths=source.paths,
        digest=_corpus_digest(source.digest, english, seq_len),
        python_version=platform.python_version(),
        num_bytes=sum(len(b) for b in source.blobs),
    )


def split_corpus(
    corpus: TextCorpus, *, heldout: float = 0.1, reference: float = 0.0, key: sbrandom.Key
) -> TextSplit:
    """Split a corpus's rows into train, held-out and clean reference sets by file.

    The files are put in an order drawn from ``key``; the first files go to ``heldout`` until
    it holds ``heldout * S`` rows or more, the next to ``reference`` likewise, the rest to
    ``train``. Whole files move, so no file's text is in two sets (rows of one file are near
    duplicates) and the fractions are met to within a file. A fraction of 0 gives an empty
    set. Rows keep their ``ids`` and their order.

    Args:
        corpus: from :func:`stdlib_corpus`.
        heldout: the held-out fraction of rows, in ``[0, 1)``.
        reference: the fraction for a clean reference set (RHO-LOSS's irreducible-loss model,
            say), in ``[0, 1)``, with ``heldout + reference < 1``.
        key: the key of the files' order.

    Returns:
        A :class:`TextSplit`.

    Raises:
        ValueError: for a fraction outside its range.

    Example:
        >>> corpus = sbfunc.datasets.stdlib_corpus(max_bytes=200_000)
        >>> parts = sbfunc.datasets.split_corpus(corpus, heldout=0.1, reference=0.05,
        ...                                      key=sbfunc.random.key(0))
        >>> sizes = [len(p["ids"]) for p in parts]
        >>> sum(sizes) == len(corpus.rows["ids"]), sizes[1] >= 0.1 * sum(sizes)
        (True, True)

    References:
        Mindermann et al. 2022, "Prioritized Training on Points that are Learnable, Worth
        Learning, and Not Yet Learnt" (RHO-LOSS's holdout set).
    """
    h = check_fraction(heldout, "heldout", open_high=True)
    r = check_fraction(reference, "reference", open_high=True)
    if h + r >= 1:
        raise ValueError(f"heldout + reference must be < 1, got {h} + {r}; leave rows to train")
    counts = torch.bincount(corpus.files, minlength=len(corpus.paths))
    order = torch.argsort(sbrandom.uniform(key, (counts.numel(),)))
    before = torch.cumsum(counts[order], 0) - counts[order]  # rows ahead of each file
    total = float(counts.sum())
    part = torch.where(before < h * total, 1, torch.where(before < (h + r) * total, 2, 0))
    file_part = torch.empty_like(part).scatter_(0, order, part)
    row_part = file_part[corpus.files]
    sets = [take(corpus.rows, torch.nonzero(row_part == p).flatten()) for p in range(3)]
    return TextSplit(*sets)


def check_rows(rows: Mapping[str, torch.Tensor]) -> int:
    missing = {"input_ids", "attention_mask", "labels", "ids"} - set(rows)
    if missing:
        raise ValueError(f"rows must have the fields of byte_rows, missing {sorted(missing)}")
    return num_rows(rows)
