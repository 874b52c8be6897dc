from collections import namedtuple

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc.policies import Queue, dequeue, empty_queue, enqueue, flush

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
    assert sbfunc.batch_size(queue.rows) == 0
    for out in emitted:
        sizes.append(sbfunc.batch_size(out))
        assert torch.equal(out["x"].x[:, 0], out["id"].float()) and out["x"].meta == "tag"
        assert torch.equal(out["y"], out["id"] % 7)  # fields stay aligned row by row
    assert torch.cat([o["id"] for o in emitted]).tolist() == selected if emitted else not selected
    assert all(s == b for s in sizes[:-1]) and all(1 <= s <= b for s in sizes)


def test_queue_is_a_pure_value():
    q0 = empty_queue(make_batch([0, 1]))
    q1 = enqueue(q0, make_batch([5, 6, 7]))
    out, q2 = dequeue(q1, 2)
    assert sbfunc.batch_size(q0.rows) == 0 and sbfunc.batch_size(q1.rows) == 3
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
