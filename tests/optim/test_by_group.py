"""``by_group``'s memo of a tree's grouping: the same dicts as grouping afresh, bounded, and
keyed by names, devices and dtypes only (it never holds a tensor)."""

from __future__ import annotations

import torch

from sbfunc.optim import _base


def _pairs(*lists: list[torch.Tensor]) -> tuple[list[torch.Tensor], ...]:
    return tuple([t * 2 for t in ts] for ts in lists)


def test_by_group_gives_one_dict_per_output_in_the_tree_order():
    tree = {
        "a": torch.ones(2),
        "b": torch.ones(1, dtype=torch.float64),
        "c": torch.full((3,), 3.0),
        "d": torch.zeros((), dtype=torch.float64),
    }
    other = {k: v + 1 for k, v in reversed(tree.items())}  # another key order
    calls = []

    def fn(xs, ys):
        calls.append(len(xs))
        return _pairs(xs, ys)

    for _ in range(2):  # the second call reads the memo
        doubled, twice_other = _base.by_group(fn, tree, other, outputs=2)
        assert list(doubled) == list(tree) and list(twice_other) == list(tree)
        for k in tree:
            assert torch.equal(doubled[k], tree[k] * 2)
            assert torch.equal(twice_other[k], other[k] * 2)
    assert calls == [2, 2, 2, 2]  # one call per (device, dtype) group


def test_by_group_of_one_group_and_of_an_empty_tree():
    tree = {"w": torch.ones(2), "b": torch.zeros(1)}
    (out,) = _base.by_group(lambda xs: (_pairs(xs)[0],), tree)
    assert list(out) == ["w", "b"] and torch.equal(out["w"], torch.full((2,), 2.0))
    assert _base.by_group(lambda xs: ([],), {}, outputs=1) == ({},)


def test_the_grouping_memo_is_bounded_and_holds_no_tensor():
    for i in range(100):
        _base.by_group(lambda xs: (xs,), {f"p{i}": torch.ones(1)})
    info = _base._memo_grouped.cache_info()
    assert info.maxsize is not None and info.currsize <= info.maxsize
    layout = (("w", torch.device("cpu"), torch.float32),)
    assert _base._memo_grouped(layout) == _base._grouped(layout) == (("w",),)
