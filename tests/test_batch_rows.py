from collections import OrderedDict, UserDict, deque, namedtuple
from collections.abc import Mapping

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sbfunc._rows import is_row_sequence, leading_size, rows_size, walk
from sbfunc.types import ROWS


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
    seen = []
    walk({"d": d}, None, lambda p, leaf, n: seen.append((p, leaf, n)), rebuild=False)
    assert seen[0][0] == ("d", 0) and seen[0][1] is d[0] and seen[0][2] == 3
    out = walk({"d": d}, None, lambda p, leaf, n: leaf[:1] if n else leaf, rebuild=True)
    assert type(out["d"]) is deque and out["d"].maxlen == 4
    assert out["d"][0].tolist() == [0] and out["d"][1] == "t"
    assert not is_row_sequence([d])  # a list of nodes holding tensors is a node


def test_rows_marker_pickles_as_the_singleton():
    import pickle

    import sbfunc._rows

    assert pickle.loads(pickle.dumps(ROWS)) is ROWS is sbfunc._rows.ROWS


Rec = namedtuple("Rec", "a b")


def _holds_array(x):
    if isinstance(x, torch.Tensor | np.ndarray):
        return x.ndim > 0
    if isinstance(x, Mapping):
        return any(_holds_array(v) for v in x.values())
    return isinstance(x, list | tuple) and any(_holds_array(v) for v in x)


def _reference(x, path=()):
    """``[(path, size)]`` of every leaf under the default rule, by plain recursion."""
    if isinstance(x, torch.Tensor | np.ndarray):
        return [(path, x.shape[0] if x.ndim else None)]
    if isinstance(x, Mapping):
        return [r for k in x for r in _reference(x[k], (*path, k))]
    if isinstance(x, list | tuple) and (hasattr(x, "_fields") or _holds_array(x)):
        keys = x._fields if hasattr(x, "_fields") else range(len(x))
        return [r for k, v in zip(keys, x, strict=True) for r in _reference(v, (*path, k))]
    return [(path, len(x) if isinstance(x, list | tuple) else None)]


_leaves = st.one_of(
    st.integers(0, 3).map(lambda n: torch.zeros(n, 2)),
    st.just(torch.tensor(1.0)),
    st.integers(0, 3).map(lambda n: np.zeros((n,))),
    st.lists(st.text(max_size=2), max_size=3),
    st.tuples(st.integers(), st.none()),
    st.sampled_from(["s", 3, None, 2.5]),
)
_keys = st.sampled_from(["b", "a", "c", "x"])
_batches = st.recursive(
    _leaves,
    lambda kids: st.one_of(
        st.dictionaries(_keys, kids, max_size=3),
        st.dictionaries(_keys, kids, max_size=3).map(UserDict),
        st.dictionaries(_keys, kids, max_size=3).map(OrderedDict),
        st.lists(kids, max_size=3),
        st.lists(kids, max_size=3).map(tuple),
        st.tuples(kids, kids).map(lambda ab: Rec(*ab)),
    ),
    max_leaves=8,
)


@settings(max_examples=150, derandomize=True, database=None, deadline=None)
@given(_batches)
def test_walk_agrees_with_a_plain_recursion_and_rebuilds_the_batch(batch):
    seen = []
    out = walk(batch, None, lambda p, leaf, n: seen.append((p, n)) or leaf, rebuild=True)
    assert seen == _reference(batch)  # the same leaves, paths and sizes, in insertion order
    assert _rebuilt(out, batch)
    assert walk(batch, False, None, rebuild=True) is batch


def _rebuilt(new, old):
    """``new`` has ``old``'s container types and the very same leaves."""
    if type(new) is not type(old):
        return False
    if isinstance(old, Mapping):
        return list(new) == list(old) and all(_rebuilt(new[k], old[k]) for k in old)
    if isinstance(old, list | tuple) and (hasattr(old, "_fields") or _holds_array(old)):
        return len(new) == len(old) and all(map(_rebuilt, new, old))
    return new is old


@settings(max_examples=60, derandomize=True, database=None, deadline=None)
@given(st.dictionaries(_keys, _batches, min_size=1, max_size=3), st.data())
def test_a_false_spec_entry_hides_its_subtree(batch, data):
    key = data.draw(st.sampled_from(list(batch)))
    seen = []
    out = walk(batch, {key: False}, lambda p, leaf, n: seen.append((p, n)) or leaf, rebuild=True)
    assert seen == [r for r in _reference(batch) if r[0][0] != key]
    assert out[key] is batch[key] and list(out) == list(batch)


def test_the_constant_result_marker_is_the_one_torch_sets():
    """``sbfunc._rows.assume_constant_result`` sets the attribute torch's own decorator sets
    (without importing ``torch._dynamo``); a torch release that changes it fails here."""
    from sbfunc._rows import assume_constant_result

    def ours():
        return 1

    def theirs():
        return 1

    assume_constant_result(ours)
    torch.compiler.assume_constant_result(theirs)
    assert vars(ours) == vars(theirs)
