from collections import namedtuple

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc

Pair = namedtuple("Pair", ["x", "y"])


@st.composite
def nested_batches(draw):
    n = draw(st.integers(1, 12))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    leaf = lambda *shape: torch.randn(n, *shape, generator=gen)  # noqa: E731
    kind = draw(st.sampled_from(["tensor", "tuple", "dict", "namedtuple", "nested"]))
    if kind == "tensor":
        batch = leaf(3)
    elif kind == "tuple":
        batch = (leaf(2, 2), leaf())
    elif kind == "dict":
        batch = {"x": leaf(4), "y": leaf(), "name": "meta", "scale": torch.tensor(2.0)}
    elif kind == "namedtuple":
        batch = Pair(leaf(3), leaf(1))
    else:
        batch = {"inputs": (leaf(2), {"mask": leaf(5)}), "target": Pair(leaf(), leaf(2)), "n": 3}
    return n, batch


@settings(max_examples=60, deadline=None, derandomize=True)
@given(nested_batches(), st.data())
def test_take_selects_rows_of_every_leaf(nb, data):
    n, batch = nb
    idx = data.draw(st.lists(st.integers(0, n - 1), max_size=2 * n))
    indices = torch.tensor(idx, dtype=torch.long)
    pruned = sbfunc.take(batch, indices)
    assert type(pruned) is type(batch)
    import optree

    leaves, spec = optree.tree_flatten(batch)
    new_leaves, new_spec = optree.tree_flatten(pruned)
    assert spec == new_spec
    for old, new in zip(leaves, new_leaves, strict=True):
        if isinstance(old, torch.Tensor) and old.dim() >= 1:
            assert torch.equal(new, old[indices])
        else:
            assert new is old
    if idx:
        assert sbfunc.batch_size(pruned) == len(idx)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(nested_batches())
def test_take_does_not_mutate_input(nb):
    n, batch = nb
    import optree

    before = [x.clone() if isinstance(x, torch.Tensor) else x for x in optree.tree_leaves(batch)]
    sbfunc.take(batch, torch.arange(n).flip(0))
    after = optree.tree_leaves(batch)
    for a, b in zip(before, after, strict=True):
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def test_batch_size_of_forms():
    assert sbfunc.batch_size(torch.zeros(5, 2)) == 5
    assert sbfunc.batch_size((torch.zeros(3), torch.zeros(3, 7))) == 3
    assert sbfunc.batch_size({"a": {"b": torch.zeros(2)}, "meta": "x"}) == 2


def test_disagreeing_leaves_raise_naming_paths():
    with pytest.raises(ValueError, match=r"disagree.*\['x'\]: 4.*\['y'\]: 3"):
        sbfunc.batch_size({"x": torch.zeros(4), "y": torch.zeros(3)})
    with pytest.raises(ValueError, match="disagree"):
        sbfunc.take((torch.zeros(4), torch.zeros(3)), torch.tensor([0]))


def test_batch_without_tensors_raises():
    with pytest.raises(ValueError, match="no per-sample tensor leaf"):
        sbfunc.batch_size({"a": 1, "s": torch.tensor(1.0)})


@pytest.mark.parametrize(
    ("indices", "exc", "msg"),
    [
        (torch.tensor([[0]]), ValueError, "1-D"),
        (torch.tensor([0.0]), TypeError, "integer dtype"),
        (torch.tensor([True]), TypeError, "integer dtype"),
        ([0, 1], TypeError, "1-D integer tensor"),
    ],
)
def test_take_validates_indices(indices, exc, msg):
    with pytest.raises(exc, match=msg):
        sbfunc.take(torch.zeros(3), indices)


def test_extract_and_replace():
    batch = Pair(torch.zeros(2), torch.ones(2))
    assert sbfunc.extract(batch, 1) is batch.y
    assert type(sbfunc.replace(batch, 0, 5)) is Pair
    assert sbfunc.replace([1, 2], 0, 9) == [9, 2]
    assert sbfunc.extract({"a": 1}, lambda b: b["a"] + 1) == 2
    with pytest.raises(KeyError, match="available keys"):
        sbfunc.extract({"a": 1}, "b")
    with pytest.raises(IndexError, match="out of range"):
        sbfunc.extract((1,), 3)
    with pytest.raises(TypeError, match="pass a str key"):
        sbfunc.extract({"a": 1}, 0)
    with pytest.raises(TypeError, match="pass an int index"):
        sbfunc.extract((1,), "a")


def test_namedtuple_fields_by_name():
    from collections import namedtuple

    Pair = namedtuple("Pair", "x y")
    b = Pair(torch.ones(2), torch.zeros(2))
    assert sbfunc.extract(b, "y") is b.y
    assert sbfunc.replace(b, "y", 3) == Pair(b.x, 3)
    with pytest.raises(KeyError, match="not a field of Pair"):
        sbfunc.replace(b, "z", 3)


@pytest.mark.parametrize("key", [lambda b: b[0], True, 1.0])
def test_replace_refuses_keys_it_cannot_write(key):
    with pytest.raises(TypeError, match="key must be an int or str field"):
        sbfunc.replace((1, 2), key, 0)


def test_take_refuses_small_integer_dtypes():
    with pytest.raises(TypeError, match="int64, int32"):
        sbfunc.take((torch.ones(3),), torch.tensor([0], dtype=torch.uint8))
