"""The standard library corpus: byte-level rows, their padding and labels, the digest, the
split by file."""

import platform

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc import random as sbrandom
from sbfunc.datasets import byte_rows, split_corpus, stdlib_corpus
from sbfunc.datasets._stdlib import read_stdlib
from tests.datasets.helpers import check_rows

SETTINGS = settings(max_examples=25, derandomize=True, database=None, deadline=None)
SMALL = {"seq_len": 64, "max_bytes": 150_000}


@pytest.fixture(scope="module")
def corpus():
    return stdlib_corpus(**SMALL)


def test_corpus_rows_follow_the_causal_lm_conventions(corpus):
    check_rows(corpus.rows, 64)
    n = corpus.rows["ids"].shape[0]
    assert torch.equal(corpus.rows["ids"], torch.arange(n))
    assert not corpus.rows["kind"].any()
    assert corpus.files.shape == (n,) and corpus.files.dtype == torch.int64


def test_rows_reassemble_the_files_read(corpus):
    source = read_stdlib(SMALL["max_bytes"], False)
    assert corpus.paths == source.paths == tuple(sorted(source.paths))
    assert corpus.num_bytes == sum(map(len, source.blobs)) == SMALL["max_bytes"]
    real = corpus.rows["attention_mask"] == 1
    for f in (0, len(source.paths) // 2, len(source.paths) - 1):
        rows = corpus.files == f
        text = bytes(corpus.rows["input_ids"][rows][real[rows]].tolist())
        blob = source.blobs[f]
        assert text == (blob[:-1] if len(blob) % 64 == 1 else blob)  # 1-byte tail left out


def test_corpus_is_deterministic_and_names_its_data(corpus):
    again = stdlib_corpus(**SMALL)
    assert again.digest == corpus.digest and len(corpus.digest) == 64
    assert all(torch.equal(again.rows[k], corpus.rows[k]) for k in corpus.rows)
    assert again.rows["input_ids"] is not corpus.rows["input_ids"]  # fresh tensors each call
    assert corpus.python_version == platform.python_version()
    assert stdlib_corpus(seq_len=32, max_bytes=150_000).digest != corpus.digest
    assert stdlib_corpus(seq_len=64, max_bytes=149_999).digest != corpus.digest


def test_a_larger_limit_reads_a_superset_of_files():
    small, large = read_stdlib(50_000, False), read_stdlib(300_000, False)
    assert set(small.paths) <= set(large.paths)
    assert not any("/test/" in f"/{p}" or "site-packages" in p for p in large.paths)


def test_english_is_prose_bytes(corpus):
    text = bytes(corpus.english.tolist()).decode("utf-8")
    assert corpus.english.dim() == 1 and len(text) > 100_000
    assert "statement" in text and "   if_stmt ::=" not in text  # grammar blocks left out


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"seq_len": 1}, ValueError, "seq_len must be an int >= 2"),
        ({"seq_len": 8.0}, TypeError, "seq_len"),
        ({"max_bytes": 0}, ValueError, "max_bytes must be an int >= 1"),
    ],
)
def test_corpus_validates_its_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        stdlib_corpus(**kwargs)


@SETTINGS
@given(
    docs=st.lists(st.binary(min_size=0, max_size=40), min_size=0, max_size=6),
    seq_len=st.integers(2, 9),
)
def test_byte_rows_cut_each_document_in_order(docs, seq_len):
    rows = byte_rows(docs, seq_len)
    check_rows(rows, seq_len)
    real = rows["attention_mask"] == 1
    got = bytes(rows["input_ids"][real].tolist())
    kept = [d[:-1] if len(d) % seq_len == 1 else d for d in docs]
    assert got == b"".join(kept)  # rows never span two documents: see the next line
    pieces = sum(-(-len(d) // seq_len) for d in kept)
    assert rows["ids"].shape[0] == pieces


def test_split_is_by_file_disjoint_and_keyed(corpus):
    parts = split_corpus(corpus, heldout=0.1, reference=0.05, key=sbrandom.key(3))
    ids = [p["ids"] for p in parts]
    assert sorted(torch.cat(ids).tolist()) == list(range(corpus.rows["ids"].shape[0]))
    files = [set(corpus.files[i].tolist()) for i in ids]
    assert not (files[0] & files[1] or files[0] & files[2] or files[1] & files[2])
    for p in parts:
        check_rows(p, 64)
        assert bool((p["ids"][1:] > p["ids"][:-1]).all())  # rows keep their order
    again = split_corpus(corpus, heldout=0.1, reference=0.05, key=sbrandom.key(3))
    assert all(torch.equal(a["ids"], b["ids"]) for a, b in zip(parts, again, strict=True))
    other = split_corpus(corpus, heldout=0.1, reference=0.05, key=sbrandom.key(4))
    assert not torch.equal(other.heldout["ids"], parts.heldout["ids"])


@SETTINGS
@given(heldout=st.floats(0.0, 0.6), reference=st.floats(0.0, 0.3), seed=st.integers(0, 99))
def test_split_meets_the_fractions_to_within_a_file(corpus, heldout, reference, seed):
    parts = split_corpus(corpus, heldout=heldout, reference=reference, key=sbrandom.key(seed))
    n = corpus.rows["ids"].shape[0]
    largest = int(torch.bincount(corpus.files).max())
    for part, fraction in ((parts.heldout, heldout), (parts.reference, reference)):
        size = part["ids"].shape[0]
        assert size == 0 if fraction == 0 else fraction * n - largest <= size
        assert size <= fraction * n + largest


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"heldout": 1.0}, r"heldout must be in \[0, 1\)"),
        ({"heldout": 0.6, "reference": 0.4}, "< 1"),
    ],
)
def test_split_validates_fractions(corpus, kwargs, match):
    with pytest.raises(ValueError, match=match):
        split_corpus(corpus, key=sbrandom.key(0), **kwargs)


def test_the_face_lists_the_text_api():
    assert {"stdlib_corpus", "split_corpus", "mixed_stream", "dict_batches", "byte_rows"} <= set(
        dir(sbfunc.datasets)
    )
    assert "_text" not in dir(sbfunc.datasets) and "torch" not in dir(sbfunc.datasets)
