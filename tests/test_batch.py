import copy
from collections import OrderedDict, UserDict, defaultdict, namedtuple
from collections.abc import Mapping
from types import MappingProxyType

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
import sbfunc._rows

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
    pruned = sbfunc.batch.take(batch, indices)
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
        assert sbfunc.batch.batch_size(pruned) == len(idx)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(nested_batches())
def test_take_does_not_mutate_input(nb):
    n, batch = nb
    import optree

    before = [x.clone() if isinstance(x, torch.Tensor) else x for x in optree.tree_leaves(batch)]
    sbfunc.batch.take(batch, torch.arange(n).flip(0))
    after = optree.tree_leaves(batch)
    for a, b in zip(before, after, strict=True):
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def test_batch_size_of_forms():
    assert sbfunc.batch.batch_size(torch.zeros(5, 2)) == 5
    assert sbfunc.batch.batch_size((torch.zeros(3), torch.zeros(3, 7))) == 3
    assert sbfunc.batch.batch_size({"a": {"b": torch.zeros(2)}, "meta": "x"}) == 2


def test_disagreeing_leaves_raise_naming_paths():
    with pytest.raises(ValueError, match=r"disagree.*\['x'\]: 4.*\['y'\]: 3.*per_sample="):
        sbfunc.batch.batch_size({"x": torch.zeros(4), "y": torch.zeros(3)})
    with pytest.raises(ValueError, match=r"disagree.*\[0\]: 4, batch\[1\]: 3"):
        sbfunc.batch.take((torch.zeros(4), torch.zeros(3)), torch.tensor([0]))


def test_batch_without_tensors_raises():
    with pytest.raises(ValueError, match="no per-sample leaf"):
        sbfunc.batch.batch_size({"a": 1, "s": torch.tensor(1.0)})


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
        sbfunc.batch.take(torch.zeros(3), indices)


def test_extract_and_replace():
    batch = Pair(torch.zeros(2), torch.ones(2))
    assert sbfunc.batch.extract(batch, 1) is batch.y
    assert type(sbfunc.batch.replace(batch, 0, 5)) is Pair
    assert sbfunc.batch.replace([1, 2], 0, 9) == [9, 2]
    assert sbfunc.batch.extract({"a": 1}, lambda b: b["a"] + 1) == 2
    with pytest.raises(KeyError, match="available keys"):
        sbfunc.batch.extract({"a": 1}, "b")
    with pytest.raises(IndexError, match="out of range"):
        sbfunc.batch.extract((1,), 3)
    with pytest.raises(TypeError, match="pass a str key"):
        sbfunc.batch.extract({"a": 1}, 0)
    with pytest.raises(TypeError, match="pass an int index"):
        sbfunc.batch.extract((1,), "a")


def test_namedtuple_fields_by_name():
    from collections import namedtuple

    Pair = namedtuple("Pair", "x y")
    b = Pair(torch.ones(2), torch.zeros(2))
    assert sbfunc.batch.extract(b, "y") is b.y
    assert sbfunc.batch.replace(b, "y", 3) == Pair(b.x, 3)
    with pytest.raises(KeyError, match="not a field of Pair"):
        sbfunc.batch.replace(b, "z", 3)


@pytest.mark.parametrize("key", [lambda b: b[0], True, 1.0])
def test_replace_refuses_keys_it_cannot_write(key):
    with pytest.raises(TypeError, match="key must be an int or str field"):
        sbfunc.batch.replace((1, 2), key, 0)


def test_take_refuses_small_integer_dtypes():
    with pytest.raises(TypeError, match="int64, int32"):
        sbfunc.batch.take((torch.ones(3),), torch.tensor([0], dtype=torch.uint8))


# --- mixed batches: lists, tuples, NumPy arrays, mappings, namedtuples ---------------------

Rec = namedtuple("Rec", ["ids", "names"])


def _row_ids(leaf):
    """The row numbers a per-sample leaf built by ``mixed_batches`` holds, as a list."""
    if isinstance(leaf, torch.Tensor | np.ndarray):
        first = leaf[(slice(None),) + (0,) * (leaf.ndim - 1)]
        return [int(v) for v in first]
    return [int(v["id"]) if isinstance(v, dict) else int(str(v).lstrip("s")) for v in leaf]


@st.composite
def mixed_batches(draw):
    """``(n, batch, per_sample_paths, metadata_paths)``: every per-sample leaf encodes its row
    number, so a pruned leaf can be checked against the indices without a reference take."""
    n = draw(st.integers(0, 7))
    rows = torch.arange(n)
    makers = {
        "tensor": lambda: rows.double()[:, None].expand(n, 3).clone(),
        "int_tensor": lambda: rows.clone(),
        "array": lambda: np.arange(n)[:, None] * np.ones((1, 2)),
        "strings": lambda: [f"s{i}" for i in range(n)],
        "tuple_ids": lambda: tuple(range(n)),
        "records": lambda: [{"id": i, "tag": "r"} for i in range(n)],
    }
    meta = {
        "name": "mnist",
        "scale": torch.tensor(2.0),
        "np_scalar": np.array(3.0),
        "count": 3,
        "none": None,
    }
    kinds = draw(st.lists(st.sampled_from(sorted(makers)), min_size=1, max_size=4, unique=True))
    metas = draw(st.lists(st.sampled_from(sorted(meta)), max_size=3, unique=True))
    layout = draw(st.sampled_from(["dict", "tuple", "nested", "namedtuple"]))
    fields = {k: makers[k]() for k in kinds}
    fields.update({k: meta[k] for k in metas})
    if layout == "dict":
        batch = fields
        paths = {k: (k,) for k in fields}
    elif layout == "tuple":  # a tuple batch holding a tensor is a node (x, y, ...)
        fields = {"tensor": makers["tensor"](), **fields}
        batch = tuple(fields.values())
        paths = {k: (i,) for i, k in enumerate(fields)}
    elif layout == "nested":
        batch = {"inputs": (makers["tensor"](), dict(fields)), "label": rows.clone()}
        paths = {k: ("inputs", 1, k) for k in fields}
        paths.update({"_x": ("inputs", 0), "_y": ("label",)})
        fields.update({"_x": batch["inputs"][0], "_y": batch["label"]})
    else:
        batch = {"rec": Rec(rows.clone(), [f"s{i}" for i in range(n)]), **fields}
        paths = {k: (k,) for k in fields}
        paths.update({"_ids": ("rec", 0), "_names": ("rec", 1)})
        fields.update({"_ids": batch["rec"].ids, "_names": batch["rec"].names})
    per_sample = {k: paths[k] for k in fields if k not in meta}
    metadata = {k: paths[k] for k in fields if k in meta}
    return n, batch, per_sample, metadata


def _at(tree, path):
    for p in path:
        tree = tree[p]
    return tree


@settings(max_examples=80, derandomize=True, database=None, deadline=None)
@given(mixed_batches(), st.data())
def test_take_prunes_every_per_sample_leaf_of_mixed_batches(mb, data):
    n, batch, per_sample, metadata = mb
    before = copy.deepcopy(batch)
    idx = data.draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=2 * n if n else 0))
    pruned = sbfunc.batch.take(batch, torch.tensor(idx, dtype=torch.long))
    assert sbfunc.batch.batch_size(batch) == n
    assert sbfunc.batch.batch_size(pruned) == len(idx)
    assert type(pruned) is type(batch)
    for path in per_sample.values():
        old, new = _at(batch, path), _at(pruned, path)
        assert type(new) is type(old)
        assert _row_ids(new) == idx
    for path in metadata.values():
        assert _at(pruned, path) is _at(batch, path)
    _assert_same(batch, before)  # the input is never modified


def _assert_same(a, b):
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
    else:
        assert a == b


@settings(max_examples=40, derandomize=True, database=None, deadline=None)
@given(mixed_batches(), st.data())
def test_take_composes(mb, data):
    n, batch, _, _ = mb
    if n == 0:
        return
    i = torch.tensor(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=6)))
    j = torch.tensor(data.draw(st.lists(st.integers(0, len(i) - 1), max_size=6)), dtype=torch.long)
    _assert_same(sbfunc.batch.take(sbfunc.batch.take(batch, i), j), sbfunc.batch.take(batch, i[j]))


@settings(max_examples=40, derandomize=True, database=None, deadline=None)
@given(mixed_batches(), st.integers(0, 9))
def test_a_leaf_of_another_size_is_an_error_until_declared(mb, c):
    n, batch, _, _ = mb
    if c == n:
        c = n + 1
    batch = {"data": batch, "class_weight": torch.ones(c)}
    with pytest.raises(ValueError, match=rf"\['class_weight'\]: {c}.*per_sample="):
        sbfunc.batch.batch_size(batch)
    with pytest.raises(ValueError, match="disagree"):
        sbfunc.batch.take(batch, torch.tensor([], dtype=torch.long))
    spec = {"class_weight": False}
    assert sbfunc.batch.batch_size(batch, per_sample=spec) == n
    kept = sbfunc.batch.take(batch, torch.zeros(min(n, 1), dtype=torch.long), per_sample=spec)
    assert kept["class_weight"] is batch["class_weight"]


@settings(max_examples=40, derandomize=True, database=None, deadline=None)
@given(mixed_batches())
def test_explicit_specs_agree_with_the_inference(mb):
    n, batch, _, _ = mb
    idx = torch.arange(n).flip(0)
    inferred = sbfunc.batch.take(batch, idx)
    by_callable = sbfunc.batch.take(
        batch, idx, per_sample=lambda path, leaf: sbfunc._rows.leading_size(leaf) is not None
    )
    _assert_same(inferred, by_callable)


def test_the_issue_example_prunes_the_strings():
    batch = {"x": torch.randn(8, 2), "t": [f"s{i}" for i in range(8)]}
    assert sbfunc.batch.take(batch, torch.tensor([1, 5]))["t"] == ["s1", "s5"]


def test_default_collate_batches_with_string_fields():
    from torch.utils.data import default_collate

    samples = [{"x": torch.full((2,), float(i)), "y": i, "name": f"n{i}"} for i in range(5)]
    batch = default_collate(samples)
    assert isinstance(batch["name"], list)
    kept = sbfunc.batch.take(batch, torch.tensor([4, 0]))
    assert kept["name"] == ["n4", "n0"] and kept["y"].tolist() == [4, 0]
    pairs = default_collate([(torch.zeros(2), f"n{i}") for i in range(3)])  # [x, ("n0", ...)]
    assert sbfunc.batch.take(pairs, torch.tensor([2]))[1] == ("n2",)


def test_row_sequences_keep_their_types():
    names = ("a", "b", "c")
    assert sbfunc.batch.take({"x": torch.zeros(3), "n": names}, torch.tensor([2, 0]))["n"] == (
        "c",
        "a",
    )
    assert sbfunc.batch.take(["a", "b", "c"], torch.tensor([1])) == ["b"]
    assert sbfunc.batch.batch_size(("a", "b")) == 2
    arr = np.arange(6).reshape(3, 2)
    out = sbfunc.batch.take((torch.zeros(3), arr), torch.tensor([2]))[1]
    assert isinstance(out, np.ndarray) and out.tolist() == [[4, 5]]


def test_mappings_keep_their_types_where_they_can():
    x = torch.arange(3)
    od = sbfunc.batch.take(OrderedDict(x=x), torch.tensor([1]))
    assert type(od) is OrderedDict and od["x"].tolist() == [1]
    dd = sbfunc.batch.take(defaultdict(int, x=x), torch.tensor([1]))
    assert type(dd) is defaultdict and dd.default_factory is int
    ud = sbfunc.batch.take(UserDict(x=x, t=["a", "b", "c"]), torch.tensor([2]))
    assert type(ud) is UserDict and ud["t"] == ["c"]
    proxy = sbfunc.batch.take(MappingProxyType({"x": x}), torch.tensor([0]))
    assert type(proxy) is MappingProxyType and proxy["x"].tolist() == [0]

    class KwargsOnly(Mapping):  # cannot be rebuilt from a dict: a plain dict comes back
        def __init__(self, **kw):
            self._d = kw

        def __getitem__(self, k):
            return self._d[k]

        def __iter__(self):
            return iter(self._d)

        def __len__(self):
            return len(self._d)

    plain = sbfunc.batch.take(KwargsOnly(x=x), torch.tensor([2]))
    assert type(plain) is dict and plain["x"].tolist() == [2]


def test_rows_marks_a_list_of_per_sample_containers():
    targets = [{"boxes": torch.zeros(k, 4), "labels": torch.zeros(k)} for k in (2, 0, 3)]
    batch = (torch.zeros(3, 1, 4, 4), targets)
    with pytest.raises(ValueError, match=r"batch\[1\]\[0\]\['boxes'\]: 2.*ROWS"):
        sbfunc.batch.batch_size(batch)
    spec = (True, sbfunc.types.ROWS)
    assert sbfunc.batch.batch_size(batch, per_sample=spec) == 3
    kept = sbfunc.batch.take(batch, torch.tensor([2, 1]), per_sample=spec)
    assert [t["boxes"].shape[0] for t in kept[1]] == [3, 0]
    assert kept[1][0] is targets[2]


def test_metadata_that_only_looks_per_sample_needs_a_spec():
    batch = {"x": torch.zeros(3, 2), "class_weight": torch.tensor([1.0, 2.0, 3.0]), "hw": (4, 4)}
    with pytest.raises(ValueError, match=r"\['hw'\]: 2"):
        sbfunc.batch.batch_size(batch)
    spec = {"class_weight": False, "hw": False}
    kept = sbfunc.batch.take(batch, torch.tensor([0]), per_sample=spec)
    assert kept["class_weight"] is batch["class_weight"] and kept["hw"] is batch["hw"]
    by_name = sbfunc.batch.take(
        batch, torch.tensor([0]), per_sample=lambda path, _: path == ("x",)
    )
    assert by_name["class_weight"] is batch["class_weight"]


def test_spec_errors_name_the_place():
    batch = {"x": torch.zeros(2), "meta": "m", "pair": (torch.zeros(2), torch.zeros(2))}
    with pytest.raises(TypeError, match=r"marks batch\['meta'\] as per-sample, but a str"):
        sbfunc.batch.batch_size(batch, per_sample={"meta": True})
    with pytest.raises(TypeError, match=r"marks batch\['meta'\]"):
        sbfunc.batch.batch_size(batch, per_sample=True)
    with pytest.raises(ValueError, match=r"names \['y'\].*keys are \['x', 'meta', 'pair'\]"):
        sbfunc.batch.batch_size(batch, per_sample={"y": False})
    with pytest.raises(ValueError, match=r"per_sample\['pair'\] is a tuple of 3 entries"):
        sbfunc.batch.batch_size(batch, per_sample={"pair": (True, True, True)})
    with pytest.raises(TypeError, match=r"per_sample\['x'\] is a dict, but batch\['x'\] is a"):
        sbfunc.batch.batch_size(batch, per_sample={"x": {"a": True}})
    with pytest.raises(TypeError, match=r"per_sample\['x'\] must be None, True, False"):
        sbfunc.batch.batch_size(batch, per_sample={"x": 1})
    with pytest.raises(TypeError, match="must return a bool"):
        sbfunc.batch.batch_size(batch, per_sample=lambda path, leaf: 1)
    with pytest.raises(ValueError, match="no per-sample leaf"):
        sbfunc.batch.batch_size(batch, per_sample=False)
    with pytest.raises(TypeError, match=r"per_sample\[0\]\['a'\] must be"):
        sbfunc._rows.check_per_sample([{"a": "yes"}])


def test_namedtuple_batches_take_dict_specs_by_field_name():
    rec = Rec(torch.arange(3), torch.ones(2))
    with pytest.raises(ValueError, match=r"batch\.ids: 3, batch\.names: 2"):
        sbfunc.batch.batch_size(rec)
    kept = sbfunc.batch.take(rec, torch.tensor([1]), per_sample={"names": False})
    assert type(kept) is Rec and kept.ids.tolist() == [1] and kept.names is rec.names


def test_empty_batches_and_sequences():
    batch = {"x": torch.zeros(0, 2), "t": []}
    assert sbfunc.batch.batch_size(batch) == 0
    full = {"x": torch.zeros(2, 2), "t": ["a", "b"]}
    empty = sbfunc.batch.take(full, torch.tensor([], dtype=torch.long))
    assert empty["t"] == [] and empty["x"].shape == (0, 2) and sbfunc.batch.batch_size(empty) == 0


@settings(max_examples=60, derandomize=True, database=None, deadline=None)
@given(mixed_batches(), st.data())
def test_strings_as_row_indices_stay_aligned_with_the_rows(mb, data):
    n, batch, per_sample, metadata = mb
    before = copy.deepcopy(batch)
    tagged = sbfunc.batch.strings_as_row_indices(batch)
    idx = data.draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=2 * n if n else 0))
    indices = torch.tensor(idx, dtype=torch.long)
    pruned, reference = sbfunc.batch.take(tagged, indices), sbfunc.batch.take(batch, indices)
    assert sbfunc.batch.batch_size(tagged) == n
    for path in per_sample.values():
        old = _at(batch, path)
        if all(isinstance(v, str) for v in old) and not isinstance(old, torch.Tensor | np.ndarray):
            assert torch.equal(_at(pruned, path), indices)  # the strings' rows, as indices
        else:
            _assert_same(_at(pruned, path), _at(reference, path))
    for path in metadata.values():
        assert _at(tagged, path) is _at(batch, path)
    _assert_same(batch, before)


def test_strings_as_row_indices_passes_string_free_batches_through():
    batch = {"x": torch.zeros(3, 2), "ids": (1, 2, 3), "name": "train"}
    assert sbfunc.batch.strings_as_row_indices(batch) is batch
    spec = {"t": False}
    kept = {"x": torch.zeros(2), "t": ["a", "b"]}  # declared metadata: not a row sequence
    assert sbfunc.batch.strings_as_row_indices(kept, per_sample=spec) is kept
