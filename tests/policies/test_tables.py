import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sbfunc.policies._tables import (
    history_cdf,
    history_init,
    history_push,
    lookup_by_id,
    table_init,
    table_lookup,
    table_ranks,
    table_update,
)

floats = st.floats(-100, 100, allow_nan=False, width=32)
pushes = st.lists(st.lists(floats, min_size=0, max_size=12), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(size=st.integers(1, 10), batches=pushes, queries=st.lists(floats, min_size=1, max_size=5))
def test_ring_buffer_matches_a_list_of_the_most_recent(size, batches, queries):
    history, everything = history_init(size), []
    for batch in batches:
        before = history.values.clone()
        new = history_push(history, torch.tensor(batch, dtype=torch.float32))
        assert torch.equal(history.values, before)  # the input is untouched
        history, everything = new, everything + batch
    recent = everything[-size:]
    assert int(history.pushed) == len(everything)
    assert sorted(history.values[: len(recent)].tolist()) == sorted(recent)
    cdf = history_cdf(history, torch.tensor(queries))
    for q, c in zip(queries, cdf.tolist(), strict=True):
        want = sum(v <= q for v in recent) / len(recent) if recent else 0.0
        assert abs(c - want) < 1e-6


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(
    updates=st.lists(
        st.lists(
            st.tuples(st.integers(0, 9), floats), min_size=1, max_size=6, unique_by=lambda x: x[0]
        ),
        min_size=1,
        max_size=5,
    )
)
def test_table_matches_a_dict_and_ranks_count_higher_losses(updates):
    table, ref = table_init(10), {}
    for epoch, batch in enumerate(updates):
        ids = torch.tensor([i for i, _ in batch])
        losses = torch.tensor([v for _, v in batch], dtype=torch.float32)
        before = table.loss.clone()
        old = table
        table = table_update(table, ids, losses, epoch)
        assert torch.equal(old.loss, before)  # the input table is untouched
        ref.update(
            {i: (float(v), epoch) for i, v in zip(ids.tolist(), losses.tolist(), strict=True)}
        )
    for i in range(10):
        row = table_lookup(table, torch.tensor([i]))
        if i in ref:
            assert (row.loss.item(), row.epoch.item()) == ref[i]
        else:
            assert row.epoch.item() == -1
    ids = torch.tensor(sorted(ref))
    rank, seen = table_ranks(table, ids)
    assert int(seen) == len(ref)
    for i, r in zip(ids.tolist(), rank.tolist(), strict=True):
        assert r == sum(v > ref[i][0] for v, _ in ref.values())


def test_masked_update_keeps_the_other_rows():
    table = table_update(table_init(3), torch.tensor([0, 1]), torch.tensor([1.0, 2.0]), 0)
    table = table_update(
        table, torch.tensor([0, 1]), torch.tensor([5.0, 6.0]), 4, mask=torch.tensor([True, False])
    )
    assert table.loss.tolist() == [5.0, 2.0, 0.0] and table.epoch.tolist() == [4, 0, -1]


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(size=st.integers(1, 8), ids=st.lists(st.integers(-3, 12), min_size=1, max_size=6))
def test_lookup_by_id_serves_ids_in_range_and_names_the_table_otherwise(size, ids):
    table = torch.arange(size, dtype=torch.float32) * 10
    if all(0 <= i < size for i in ids):
        got = lookup_by_id(table, torch.tensor(ids), "irreducible", "rho_loss")
        assert got.tolist() == [10.0 * i for i in ids]
        return
    found = f"the largest id is {max(ids)}" if max(ids) >= size else f"an id is {min(ids)}"
    with pytest.raises(ValueError, match=f"rho_loss: irreducible has {size} entries .*{found}"):
        lookup_by_id(table, torch.tensor(ids), "irreducible", "rho_loss")


@pytest.mark.slow
def test_lookup_by_id_reads_no_id_inside_a_compiled_function():
    def lookup(table, ids):
        return lookup_by_id(table, ids, "irreducible", "rho_loss") * 2

    compiled = torch.compile(lookup, backend="eager", fullgraph=True)
    got = compiled(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([2, 0]))
    assert got.tolist() == [6.0, 2.0]
