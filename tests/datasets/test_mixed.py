"""The mixed stream (code, random bytes, English, tagged by kind) and dict batches."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sbfunc import random as sbrandom
from sbfunc.datasets import batches, byte_rows, dict_batches, mixed_stream, stdlib_corpus
from tests.datasets.helpers import check_rows

SETTINGS = settings(max_examples=20, derandomize=True, database=None, deadline=None)


@pytest.fixture(scope="module")
def corpus():
    return stdlib_corpus(seq_len=32, max_bytes=20_000)


@SETTINGS
@given(random=st.floats(0, 0.5), english=st.floats(0, 0.5), seed=st.integers(0, 99))
def test_kinds_have_the_exact_fractions_and_laws(corpus, random, english, seed):
    rows = corpus.rows
    n = rows["ids"].shape[0]
    stream = mixed_stream(
        rows,
        corpus.english,
        random_fraction=random,
        english_fraction=english,
        key=sbrandom.key(seed),
    )
    check_rows(stream, 32)
    counts = torch.bincount(stream["kind"], minlength=3).tolist()
    off = round((random + english) * n)  # rounded together: never more than n
    assert counts == [n - off, round(random * n), off - round(random * n)]
    assert abs(counts[2] - english * n) <= 1
    assert torch.equal(stream["ids"], rows["ids"])  # replaced rows keep their ids
    clean = stream["kind"] == 0
    for name in ("input_ids", "attention_mask", "labels"):
        assert torch.equal(stream[name][clean], rows[name][clean])
    assert bool((stream["attention_mask"][~clean] == 1).all())  # off-target rows are full


def test_english_rows_are_windows_of_the_prose(corpus):
    stream = mixed_stream(corpus.rows, corpus.english, english_fraction=0.3, key=sbrandom.key(0))
    text = bytes(corpus.english.tolist())
    for row in stream["input_ids"][stream["kind"] == 2][:20]:
        assert bytes(row.tolist()) in text


def test_the_stream_is_keyed_and_leaves_its_input_alone(corpus):
    before = {k: v.clone() for k, v in corpus.rows.items()}
    kwargs = {"random_fraction": 0.2, "english_fraction": 0.2}
    a = mixed_stream(corpus.rows, corpus.english, key=sbrandom.key(1), **kwargs)
    b = mixed_stream(corpus.rows, corpus.english, key=sbrandom.key(1), **kwargs)
    c = mixed_stream(corpus.rows, corpus.english, key=sbrandom.key(2), **kwargs)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["kind"], c["kind"])
    assert all(torch.equal(before[k], corpus.rows[k]) for k in before)


def test_random_rows_are_spread_over_the_bytes(corpus):
    stream = mixed_stream(corpus.rows, corpus.english, random_fraction=1.0, key=sbrandom.key(0))
    counts = torch.bincount(stream["input_ids"].flatten(), minlength=257)
    assert counts[256] == 0 and bool((counts[:256] > 0).all())


def test_a_stream_without_kind_gets_one_and_mixing_again_keeps_it():
    rows = {k: v for k, v in byte_rows([b"x = 1\n" * 20], 8).items() if k != "kind"}
    prose = torch.tensor(list(b"Plain English words for the prose rows."))
    once = mixed_stream(rows, prose, random_fraction=0.5, key=sbrandom.key(0))
    twice = mixed_stream(once, prose, english_fraction=0.25, key=sbrandom.key(1))
    assert int((once["kind"] == 1).sum()) == 8
    assert int((twice["kind"] == 2).sum()) == 4 and int((twice["kind"] != 0).sum()) >= 8


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"random_fraction": 0.7, "english_fraction": 0.4}, ValueError, "<= 1"),
        ({"random_fraction": -0.1}, ValueError, "random_fraction must be"),
        (
            {"english_fraction": 0.5, "english": torch.zeros(4, dtype=torch.long)},
            ValueError,
            "at least seq_len",
        ),
        ({"english": torch.zeros(100)}, TypeError, "english must be a 1-D integer tensor"),
        ({"rows": {"input_ids": torch.zeros(2, 4, dtype=torch.long)}}, ValueError, "missing"),
    ],
)
def test_mixed_stream_validates(corpus, kwargs, error, match):
    args = {"rows": corpus.rows, "english": corpus.english, **kwargs}
    with pytest.raises(error, match=match):
        mixed_stream(key=sbrandom.key(0), **args)


def test_dict_batches_follow_the_order_of_batches(corpus):
    rows = corpus.rows
    n = rows["ids"].shape[0]
    x, y = torch.zeros(n, 1), torch.arange(n)
    key = sbrandom.key(5)
    got = list(dict_batches(rows, 16, key=key))
    want = list(batches(x, y, 16, key=key))
    assert len(got) == len(want) == n // 16
    for b, (_, _, ids) in zip(got, want, strict=True):
        assert torch.equal(b["ids"], ids) and b["input_ids"].shape == (16, 32)
        assert set(b) == set(rows)


def test_dict_batches_cover_every_row_once_without_drop_last(corpus):
    got = list(dict_batches(corpus.rows, 50, key=sbrandom.key(0), drop_last=False))
    ids = torch.cat([b["ids"] for b in got])
    assert sorted(ids.tolist()) == list(range(corpus.rows["ids"].shape[0]))


@pytest.mark.parametrize(
    ("rows", "size", "error", "match"),
    [
        ({"a": torch.zeros(3), "b": torch.zeros(4)}, 2, ValueError, "same number of rows"),
        ({"a": torch.zeros(3)}, 0, ValueError, "batch_size must be an int >= 1"),
    ],
)
def test_dict_batches_validate(rows, size, error, match):
    with pytest.raises(error, match=match):
        list(dict_batches(rows, size, key=sbrandom.key(0)))
