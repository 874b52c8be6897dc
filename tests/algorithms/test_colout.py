import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc import random as sbrandom
from sbfunc.algorithms import ColOut, colout_batch

common = settings(max_examples=30, deadline=None, derandomize=True, database=None)


def _coded(n, c, h, w):
    """Images whose pixel (i, j) holds ``100 * i + j`` (so dropped rows/columns show)."""
    grid = torch.arange(h).view(h, 1) * 100 + torch.arange(w).view(1, w)
    return grid.float().expand(n, c, h, w).clone()


@common
@given(
    st.integers(0, 2**32),
    st.sampled_from([0.0, 0.15, 0.5, 0.9]),
    st.sampled_from([0.0, 0.15, 0.5, 0.9]),
    st.sampled_from([(8, 8), (5, 12), (1, 3)]),
)
def test_colout_drops_the_same_rows_and_columns_everywhere(seed, p_row, p_col, hw):
    h, w = hw
    x = _coded(3, 2, h, w)
    mask = (x[:, 0] % 7).long()  # a per-pixel target
    labels = torch.tensor([0, 1, 2])
    out, out_mask = colout_batch(x, mask, key=sbrandom.key(seed), p_row=p_row, p_col=p_col)
    kept_h, kept_w = max(1, int((1 - p_row) * h)), max(1, int((1 - p_col) * w))
    assert out.shape == (3, 2, kept_h, kept_w) and out_mask.shape == (3, kept_h, kept_w)
    rows, cols = out[0, 0, :, 0] // 100, out[0, 0, 0, :] % 100
    assert bool((rows[1:] > rows[:-1]).all()) and bool((cols[1:] > cols[:-1]).all())
    expected = x[..., rows.long(), :][..., cols.long()]
    assert torch.equal(out, expected)  # every image and channel: the same rows and columns
    assert torch.equal(out_mask, mask[..., rows.long(), :][..., cols.long()])
    same, kept_labels = colout_batch(x, labels, key=sbrandom.key(seed), p_row=p_row, p_col=p_col)
    assert torch.equal(same, out) and kept_labels is labels  # class labels are not images


def test_colout_zero_fractions_are_the_identity():
    x, y = torch.rand(2, 3, 6, 7), torch.randint(0, 3, (2, 6, 7))
    out, out_y = colout_batch(x, y, key=sbrandom.key(0), p_row=0.0, p_col=0.0)
    assert torch.equal(out, x) and torch.equal(out_y, y)


def test_colout_depends_on_the_key_only():
    x = _coded(2, 1, 16, 16)
    a = colout_batch(x, key=sbrandom.key(0), p_row=0.5, p_col=0.5)[0]
    b = colout_batch(x, key=sbrandom.key(0), p_row=0.5, p_col=0.5)[0]
    c = colout_batch(x, key=sbrandom.key(1), p_row=0.5, p_col=0.5)[0]
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_colout_resize_target_modes():
    x, y = torch.rand(2, 3, 8, 8), torch.randint(0, 3, (2, 8, 8))
    _, kept = colout_batch(x, y, key=sbrandom.key(0), p_row=0.5, resize_target=False)
    assert kept is y
    _, resized = colout_batch(x, y, key=sbrandom.key(0), p_row=0.5, resize_target=True)
    assert resized.shape == (2, 4, 6)  # p_col defaults to 0.15
    with pytest.raises(ValueError, match="resize_target=True needs a target"):
        colout_batch(x, torch.zeros(2), key=sbrandom.key(0), resize_target=True)


@pytest.mark.parametrize(
    ("kwargs", "exc", "msg"),
    [
        ({"p_row": 1.0}, ValueError, r"p_row must be in \[0, 1\)"),
        ({"p_col": -0.1}, ValueError, "p_col"),
        ({"p_row": "a"}, TypeError, "p_row"),
        ({"resize_target": "yes"}, ValueError, "resize_target"),
    ],
)
def test_colout_errors(kwargs, exc, msg):
    with pytest.raises(exc, match=msg):
        colout_batch(torch.rand(1, 1, 4, 4), key=sbrandom.key(0), **kwargs)
    with pytest.raises(exc, match=msg):
        ColOut(**kwargs)


def test_colout_algorithm_on_after_dataloader():
    x, y = _coded(4, 3, 10, 10), torch.randint(0, 3, (4, 10, 10))
    co = ColOut(p_row=0.3, p_col=0.2)
    state = sbfunc.Context(sbrandom.key(3), batch=(x, y))
    assert co.match(sbfunc.Event.AFTER_DATALOADER, state)
    assert not co.match(sbfunc.Event.BEFORE_FORWARD, state)
    out = co.apply(sbfunc.Event.AFTER_DATALOADER, state)
    ex, ey = colout_batch(x, y, key=state.key, p_row=0.3, p_col=0.2)
    assert torch.equal(out.batch[0], ex) and torch.equal(out.batch[1], ey)
    only_images = ColOut(resize_target=False, input="x")  # the target is not read
    state = sbfunc.Context(sbrandom.key(3), batch={"x": x})
    assert only_images.apply(sbfunc.Event.AFTER_DATALOADER, state).batch["x"].shape[-1] == 8
