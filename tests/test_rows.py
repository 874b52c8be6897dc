from collections import deque, namedtuple

import pytest
import torch

from sbfunc.rows import ROWS, is_row_sequence, leading_size, node, rows_size, walk


def test_row_sequence_rule():
    assert is_row_sequence(["a", "b"]) and is_row_sequence(("a", 1, None))
    assert is_row_sequence([torch.tensor(1.0), torch.tensor(2.0)])  # 0-d tensors: rows
    assert is_row_sequence([{"id": 1}, {"id": 2}]) and is_row_sequence([[1, 2], [3]])
    assert not is_row_sequence((torch.zeros(2), "meta"))  # holds a tensor: a node
    assert not is_row_sequence([{"boxes": torch.zeros(1, 4)}])
    assert not is_row_sequence(namedtuple("P", "a b")("x", "y"))  # a record, not rows
    assert not is_row_sequence("abc")


def test_leading_size_of_leaves():
    assert leading_size(torch.zeros(3, 2)) == 3 and leading_size(torch.tensor(1)) is None
    assert leading_size("abc") is None and leading_size(None) is None
    assert leading_size(["a"]) == 1 and leading_size(()) == 0


def test_rows_size_accepts_any_list_but_not_records():
    assert rows_size((), [torch.zeros(2), torch.zeros(5)]) == 2
    with pytest.raises(TypeError, match=r"marks batch\['d'\] as per-sample, but a dict"):
        rows_size(("d",), {"a": 1})


def test_optree_nodes_are_walked_and_rebuilt():
    d = deque([torch.arange(3), "t"], maxlen=4)  # an optree node sbfunc has no case for
    assert node(d)[1][0] is d[0]
    out = walk({"d": d}, None, lambda p, leaf, n: leaf[:1] if n else leaf, rebuild=True)
    assert type(out["d"]) is deque and out["d"].maxlen == 4
    assert out["d"][0].tolist() == [0] and out["d"][1] == "t"
    assert not is_row_sequence([d])  # a list of nodes holding tensors is a node


def test_rows_marker_pickles_as_the_singleton():
    import pickle

    import sbfunc.rows

    assert pickle.loads(pickle.dumps(ROWS)) is ROWS is sbfunc.rows.ROWS
