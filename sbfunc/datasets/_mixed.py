"""A mixed stream for the off-target study: clean code rows, some replaced by uniformly random
bytes or by English prose, each row tagged with its ``kind``."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from sbfunc import random as sbrandom
from sbfunc.datasets._text import check_rows
from sbfunc.validation import check_fraction, check_tensor

__all__ = ["mixed_stream"]


def _windows(text: torch.Tensor, count: int, seq_len: int, key: sbrandom.Key) -> torch.Tensor:
    """``count`` windows of ``seq_len`` bytes of ``text`` at offsets drawn from ``key``."""
    if text.numel() < seq_len:
        raise ValueError(
            f"english must hold at least seq_len = {seq_len} bytes, got {text.numel()}"
        )
    start = sbrandom.randint(key, (count,), 0, text.numel() - seq_len + 1)
    return text[start[:, None] + torch.arange(seq_len)]


def _fill(
    out: dict[str, torch.Tensor], rows: torch.Tensor, tokens: torch.Tensor, kind: int
) -> None:
    """Write full rows of ``tokens`` (no padding) at ``rows`` of ``out``, tagged ``kind``."""
    out["input_ids"][rows] = tokens
    out["labels"][rows] = tokens
    out["attention_mask"][rows] = 1
    out["kind"][rows] = kind


def mixed_stream(
    rows: Mapping[str, torch.Tensor],
    english: torch.Tensor,
    *,
    random_fraction: float = 0.0,
    english_fraction: float = 0.0,
    key: sbrandom.Key,
) -> dict[str, torch.Tensor]:
    """Replace a fraction of the rows by uniformly random bytes and another by English prose.

    Exactly ``round(random_fraction * S)`` rows, drawn from ``key``, become rows of uniformly
    random bytes (``kind`` 1) and ``round((random_fraction + english_fraction) * S)`` minus
    those (``round(english_fraction * S)`` up to one row) others become windows of
    ``english`` (``kind`` 2) at offsets drawn from ``key`` (windows may overlap, so the prose
    never runs out); the rest keep their text and their ``kind`` (0 for code rows; a missing
    ``kind`` field is added). Replaced rows are full (no padding: ``attention_mask`` all 1,
    ``labels`` equal to ``input_ids``) and keep their ``ids``, so per-sample tables still
    index the stream; only ``kind`` tells them apart. ``rows`` is not changed.

    Random bytes are unlearnable noise (their loss stays at ``log 256``); English is
    learnable text off the target distribution (code): a selection rule that favours high
    loss picks both, one that discounts what a clean reference model also finds hard
    (RHO-LOSS) should not.

    Args:
        rows: rows of :func:`byte_rows` or :func:`stdlib_corpus` (the training set).
        english: 1-D int64 bytes of prose (``TextCorpus.english``), at least ``L`` long.
        random_fraction: the fraction of rows of random bytes, in ``[0, 1]``.
        english_fraction: the fraction of rows of English, in ``[0, 1]``, with
            ``random_fraction + english_fraction <= 1``.
        key: where the rows, the bytes and the windows come from.

    Returns:
        A new rows dict with a ``kind`` field.

    Raises:
        ValueError: for a fraction outside its range, rows without the fields of
            :func:`byte_rows`, or ``english`` shorter than a row.
        TypeError: if ``english`` is not an integer tensor.

    Example:
        >>> rows = sbfunc.datasets.byte_rows([b"def f(x):\\n    return x\\n"] * 10, 8)
        >>> prose = torch.tensor(list(b"The quick brown fox jumps over the lazy dog."))
        >>> stream = sbfunc.datasets.mixed_stream(rows, prose, random_fraction=0.2,
        ...                                       english_fraction=0.1, key=sbfunc.random.key(0))
        >>> torch.bincount(stream["kind"]).tolist(), bool(torch.equal(stream["ids"], rows["ids"]))
        ([21, 6, 3], True)

    References:
        Mindermann et al. 2022, "Prioritized Training on Points that are Learnable, Worth
        Learning, and Not Yet Learnt" (noisy and off-task points that loss-based selection
        picks); Loshchilov and Hutter 2015, "Online Batch Selection".
    """
    n = check_rows(rows)
    fr = check_fraction(random_fraction, "random_fraction")
    fe = check_fraction(english_fraction, "english_fraction")
    if fr + fe > 1:
        raise ValueError(f"random_fraction + english_fraction must be <= 1, got {fr} + {fe}")
    english = check_tensor(english, "english", dim=1, floating=False)
    seq_len = rows["input_ids"].shape[1]
    n_random = round(fr * n)
    n_english = round((fr + fe) * n) - n_random  # rounded together: never more than n rows
    k_rows, k_bytes, k_windows = sbrandom.split(key, 3)
    order = torch.argsort(sbrandom.uniform(k_rows, (n,)))
    out = {name: t.clone() for name, t in rows.items()}
    out.setdefault("kind", torch.zeros(n, dtype=torch.int64))
    noise = sbrandom.randint(k_bytes, (n_random, seq_len), 0, 256)
    _fill(out, order[:n_random], noise, 1)
    if n_english:
        prose = _windows(english.to(torch.int64), n_english, seq_len, k_windows)
        _fill(out, order[n_random : n_random + n_english], prose, 2)
    return out
