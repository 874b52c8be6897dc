from collections import namedtuple

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc.selective_backprop import Queue, dequeue, empty_queue, enqueue, flush

Pair = namedtuple("Pair", ["x", "meta"])


def make_batch(ids):
    ids = torch.tensor(ids, dtype=torch.int64)
    return {"id": ids, "x": Pair(ids.float()[:, None].repeat(1, 3), "tag"), "y": ids % 7}


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(
    b=st.integers(1, 9),
    masks=st.lists(st.lists(st.booleans(), min_size=1, max_size=12), min_size=1, max_size=10),
)
def test_every_selected_sample_is_emitted_exactly_once_in_order(b, masks):
    next_id, selected, emitted, sizes = 0, [], [], []
    queue = empty_queue(make_batch([0]))
    for mask in masks:  # one epoch of variable-size selections
        ids = list(range(next_id, next_id + len(mask)))
        next_id += len(mask)
        keep = [i for i, m in zip(ids, mask, strict=True) if m]
        selected += keep
        if keep:
            queue = enqueue(queue, make_batch(keep))
        while True:
            out, queue = dequeue(queue, b)
            if out is None:
                break
            emitted.append(out)
    out, queue = flush(queue)  # leftover at the end of the epoch
    if out is not None:
        emitted.append(out)
    assert sbfunc.batch.batch_size(queue.rows) == 0
    for out in emitted:
        sizes.append(sbfunc.batch.batch_size(out))
        assert torch.equal(out["x"].x[:, 0], out["id"].float()) and out["x"].meta == "tag"
        assert torch.equal(out["y"], out["id"] % 7)  # fields stay aligned row by row
    assert torch.cat([o["id"] for o in emitted]).tolist() == selected if emitted else not selected
    assert all(s == b for s in sizes[:-1]) and all(1 <= s <= b for s in sizes)


def test_queue_is_a_pure_value():
    q0 = empty_queue(make_batch([0, 1]))
    q1 = enqueue(q0, make_batch([5, 6, 7]))
    out, q2 = dequeue(q1, 2)
    assert sbfunc.batch.batch_size(q0.rows) == 0 and sbfunc.batch.batch_size(q1.rows) == 3
    assert out["id"].tolist() == [5, 6] and q2.rows["id"].tolist() == [7]
    assert dequeue(q2, 2) == (None, q2) and flush(empty_queue(make_batch([1])))[0] is None


def test_queue_checkpoints_with_any_number_of_rows():
    import io

    q = enqueue(empty_queue(make_batch([0])), make_batch([3, 4]))
    buf = io.BytesIO()
    sbfunc.checkpoint.save(q, buf)
    buf.seek(0)
    back = sbfunc.checkpoint.load(buf, like=empty_queue(make_batch([0])))
    assert isinstance(back, Queue) and back.rows["id"].tolist() == [3, 4]


def test_bad_arguments():
    q = empty_queue(make_batch([0]))
    with pytest.raises(ValueError, match="b must be"):
        dequeue(q, 0)
    with pytest.raises(ValueError):
        enqueue(q, (torch.zeros(2),))  # another structure
    with pytest.raises(ValueError, match="per-sample"):
        empty_queue({"name": "x"})


SPEC = {"class_weight": False}


def mixed_batch(ids, tag="train"):
    """Every per-sample kind, each a function of the id; a [C] class weight with C == 3."""
    return {
        "id": torch.tensor(ids, dtype=torch.int64),
        "name": [f"n{i}" for i in ids],
        "ids": tuple(ids),
        "arr": np.array([[i, 2 * i] for i in ids], dtype=np.int64).reshape(-1, 2),
        "class_weight": torch.tensor([1.0, 2.0, 3.0]),
        "meta": {"tag": tag},
    }


def check_aligned(batch):
    ids = batch["id"].tolist()
    assert batch["name"] == [f"n{i}" for i in ids] and batch["ids"] == tuple(ids)
    assert batch["arr"].shape == (len(ids), 2) and batch["arr"][:, 1].tolist() == [
        2 * i for i in ids
    ]
    assert batch["class_weight"].tolist() == [1.0, 2.0, 3.0]


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(
    b=st.integers(1, 5),
    sizes=st.lists(st.integers(0, 4), min_size=1, max_size=8),
)
def test_mixed_leaves_stay_aligned_through_the_queue(b, sizes):
    queue, emitted, next_id, pushed = (
        empty_queue(mixed_batch([0, 1, 2]), per_sample=SPEC),
        [],
        0,
        [],
    )
    for step, size in enumerate(sizes):  # some batches have C == N == 3 rows
        ids = list(range(next_id, next_id + size))
        next_id += size
        pushed += ids
        queue = enqueue(queue, mixed_batch(ids, tag=f"t{step}"), per_sample=SPEC)
        assert queue.rows["meta"]["tag"] == f"t{step}"  # metadata: the newest batch's
        out, queue = dequeue(queue, b, per_sample=SPEC)
        if out is not None:
            assert sbfunc.batch.batch_size(out, per_sample=SPEC) == b
            emitted.append(out)
    out, queue = flush(queue, per_sample=SPEC)
    emitted += [] if out is None else [out]
    assert sbfunc.batch.batch_size(queue.rows, per_sample=SPEC) == 0
    for out in [*emitted, queue.rows]:
        check_aligned(out)
    assert [i for out in emitted for i in out["id"].tolist()] == pushed


def test_enqueue_refuses_another_kind_of_leaf():
    q = empty_queue({"x": torch.zeros(2), "s": ["a", "b"]})
    with pytest.raises(TypeError, match=r"batch\['s'\] is a Tensor, but the queue holds a list"):
        enqueue(q, {"x": torch.zeros(2), "s": torch.zeros(2)})
    with pytest.raises(ValueError, match="per-sample leaves"):
        enqueue(q, {"x": torch.zeros(2), "s": "meta"})
