import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc import random as sbrandom
from sbfunc.algorithms import ProgressiveResizing, resize_batch

common = settings(max_examples=30, deadline=None, derandomize=True, database=None)


def _coded(n, h, w):
    grid = torch.arange(h).view(h, 1) * 100 + torch.arange(w).view(1, w)
    return grid.float().expand(n, 2, h, w).clone()


@common
@given(
    st.integers(0, 2**32),
    st.sampled_from([0.25, 0.5, 0.75, 0.9]),
    st.sampled_from(["resize", "crop"]),
    st.sampled_from([(8, 8), (12, 20)]),
)
def test_resize_batch_shapes_values_and_targets(seed, scale, mode, hw):
    h, w = hw
    x, y = _coded(3, h, w), (_coded(3, h, w)[:, 0] % 5).long()
    out, out_y = resize_batch(x, y, scale, mode=mode, resize_targets=True, key=sbrandom.key(seed))
    nh, nw = int(h * scale), int(w * scale)
    assert out.shape == (3, 2, nh, nw) and out_y.shape == (3, nh, nw)
    assert out_y.dtype == y.dtype
    rows, cols = (out[0, 0, :, 0] // 100).long(), (out[0, 0, 0, :] % 100).long()
    assert torch.equal(out, x[..., rows, :][..., cols])  # nearest pixels / a window: no blend
    assert torch.equal(out_y, y[..., rows, :][..., cols])  # the targets follow the pixels
    if mode == "crop":  # one contiguous window, the same for the whole batch
        assert torch.equal(rows, rows[0] + torch.arange(nh))
        assert torch.equal(cols, cols[0] + torch.arange(nw))
    again = resize_batch(x, y, scale, mode=mode, resize_targets=True, key=sbrandom.key(seed))
    assert torch.equal(again[0], out) and torch.equal(again[1], out_y)
    kept, same_y = resize_batch(x, y, scale, mode=mode, key=sbrandom.key(seed))
    assert same_y is y and kept.shape == out.shape


def test_resize_batch_at_full_scale_is_the_identity():
    x, y = torch.rand(2, 3, 8, 8), torch.tensor([0, 1])
    out = resize_batch(x, y, 1.0, mode="crop", key=sbrandom.key(0))
    assert out[0] is x and out[1] is y


def test_crop_positions_vary_with_the_key():
    x, y = _coded(1, 16, 16), torch.zeros(1)
    corners = {
        int(resize_batch(x, y, 0.5, mode="crop", key=k)[0][0, 0, 0, 0])
        for k in sbrandom.split(sbrandom.key(0), 40)
    }
    assert len(corners) > 10


@pytest.mark.parametrize(
    ("args", "kwargs", "exc", "msg"),
    [
        ((torch.rand(2, 3, 4, 4), torch.zeros(2), 0.0), {}, ValueError, "scale_factor"),
        ((torch.rand(2, 3, 4, 4), torch.zeros(2), 0.5), {"mode": "zoom"}, ValueError, "mode"),
        ((torch.rand(2, 4), torch.zeros(2), 0.5), {}, ValueError, "rank >= 3"),
        (
            (torch.rand(2, 3, 4, 4), torch.zeros(2), 0.5),
            {"resize_targets": True},
            ValueError,
            "per",
        ),
        ((torch.rand(2, 3, 4, 4), torch.zeros(2), 0.5), {"mode": "crop"}, ValueError, "key="),
    ],
)
def test_resize_batch_errors(args, kwargs, exc, msg):
    with pytest.raises(exc, match=msg):
        resize_batch(*args, **kwargs)


@common
@given(
    st.sampled_from([0.25, 0.5, 1.0]),
    st.sampled_from([0.0, 0.2]),
    st.sampled_from([0.0, 0.5, 0.8]),
    st.sampled_from([1, 4, 8]),
    st.sampled_from([32, 36, 224]),
)
def test_schedule_grows_to_full_size_through_finitely_many_pinned_sizes(
    initial, finetune, delay, inc, width
):
    delay = min(delay, 1 - finetune)
    pr = ProgressiveResizing(
        initial_scale=initial, finetune_fraction=finetune, delay_fraction=delay, size_increment=inc
    )
    grid = [i / 500 for i in range(501)]
    scales = [pr.scale_at(t) for t in grid]
    assert all(a <= b for a, b in itertools.pairwise(scales))  # monotone
    assert all(s == initial for t, s in zip(grid, scales, strict=True) if t < delay)
    assert all(s == 1.0 for t, s in zip(grid, scales, strict=True) if t >= 1 - finetune)
    pinned = {pr.pinned_scale(t, width) for t in grid}
    widths = {round(s * width) for s in pinned}
    assert all(w_ % inc == 0 or w_ == width for w_ in widths)  # Composer's size increments
    assert len(pinned) <= width // inc + 1  # a finite number of sizes, so of graphs
    assert pr.pinned_scale(1.0, width) == 1.0


def test_match_returns_the_pinned_scale_or_false():
    pr = ProgressiveResizing(initial_scale=0.5, delay_fraction=0.5, finetune_fraction=0.2)
    batch = (torch.rand(2, 3, 32, 32), torch.tensor([0, 1]))
    early = sbfunc.Context(sbrandom.key(0), batch=batch, time=sbfunc.Time(elapsed=0.1))
    mid = early.replace(time=sbfunc.Time(elapsed=0.65))
    late = early.replace(time=sbfunc.Time(elapsed=0.85))
    assert pr.match(sbfunc.Event.AFTER_DATALOADER, early) == 0.5
    assert pr.match(sbfunc.Event.AFTER_DATALOADER, mid) == 0.75
    assert pr.match(sbfunc.Event.AFTER_DATALOADER, late) is False  # full size: nothing runs
    assert pr.match(sbfunc.Event.BEFORE_FORWARD, early) is False
    decision = pr.match(sbfunc.Event.AFTER_DATALOADER, mid)
    out = pr.apply(sbfunc.Event.AFTER_DATALOADER, mid.replace(matched=decision))
    assert out.batch[0].shape == (2, 3, 24, 24) and out.batch[1] is batch[1]
    direct = pr.apply(sbfunc.Event.AFTER_DATALOADER, mid)  # matched=True: decides itself
    assert torch.equal(direct.batch[0], out.batch[0])


def test_progressive_resizing_crops_targets_with_the_images():
    pr = ProgressiveResizing(mode="crop", initial_scale=0.5, resize_targets=True)
    x, y = _coded(2, 16, 16), (_coded(2, 16, 16)[:, 0]).long()
    state = sbfunc.Context(sbrandom.key(1), batch=(x, y), time=sbfunc.Time(elapsed=0.0))
    out = pr.apply(sbfunc.Event.AFTER_DATALOADER, state.replace(matched=0.5))
    assert out.batch[0].shape == (2, 2, 8, 8) and torch.equal(
        out.batch[0][:, 0].long(), out.batch[1]
    )


@pytest.mark.parametrize(
    ("kwargs", "exc", "msg"),
    [
        ({"mode": "zoom"}, ValueError, "mode"),
        ({"initial_scale": 0.0}, ValueError, "initial_scale"),
        ({"finetune_fraction": 1.5}, ValueError, "finetune_fraction"),
        ({"delay_fraction": 0.9, "finetune_fraction": 0.2}, ValueError, "<= 1"),
        ({"size_increment": 0}, ValueError, "size_increment"),
        ({"resize_targets": 1}, TypeError, "resize_targets"),
        ({"input": None}, TypeError, "input"),
    ],
)
def test_progressive_resizing_validates_at_construction(kwargs, exc, msg):
    with pytest.raises(exc, match=msg):
        ProgressiveResizing(**kwargs)
