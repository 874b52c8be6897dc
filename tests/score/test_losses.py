import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sbfunc
from sbfunc.score import check_scale_factor


def _setup():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3)
    )
    params, buffers = sbfunc.split_module(model)
    batch = (torch.randn(10, 1, 8, 8), torch.randint(0, 3, (10,)))
    return model, params, buffers, batch


def test_scores_are_detached_losses():
    model, params, buffers, batch = _setup()
    params = {k: v.requires_grad_() for k, v in params.items()}
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    s = sbfunc.score.score_losses(loss_fn, params, buffers, batch)
    assert not s.requires_grad and s.shape == (10,)
    torch.testing.assert_close(s, F.cross_entropy(model(batch[0]), batch[1], reduction="none"))


def test_downsampled_scores_use_interpolated_input():
    model, params, buffers, batch = _setup()
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    s = sbfunc.score.score_losses(loss_fn, params, buffers, batch, scale_factor=0.5)
    x = F.interpolate(batch[0], scale_factor=0.5, mode="bilinear", align_corners=False)
    torch.testing.assert_close(s, F.cross_entropy(model(x), batch[1], reduction="none"))


@pytest.mark.parametrize(
    ("shape", "mode"), [((2, 3, 8), "linear"), ((2, 1, 4, 4, 4), "trilinear")]
)
def test_downsample_modes(shape, mode):
    x = torch.randn(shape)
    ref = F.interpolate(x, scale_factor=0.5, mode=mode, align_corners=False)
    torch.testing.assert_close(sbfunc.score.downsample(x, 0.5), ref)


def test_scale_one_is_identity():
    x = torch.randn(3, 5)
    assert sbfunc.score.downsample(x, 1.0) is x


@pytest.mark.parametrize("shape", [(4, 5), (4,), (1, 2, 3, 4, 5, 6)])
def test_downsample_bad_rank(shape):
    with pytest.raises(ValueError, match="3-D, 4-D or 5-D"):
        sbfunc.score.downsample(torch.zeros(shape), 0.5)


@pytest.mark.parametrize("sf", [0, -0.5, 1.5, float("nan"), float("inf")])
def test_scale_factor_range(sf):
    with pytest.raises(ValueError, match=r"scale_factor must be in \(0, 1\]"):
        check_scale_factor(sf)


def test_scale_factor_type():
    with pytest.raises(TypeError, match="scale_factor"):
        check_scale_factor("0.5")


def test_dict_batch_downsample_and_callable_input_rejected():
    model, params, buffers, (x, y) = _setup()
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, input="x", target="y")
    s = sbfunc.score.score_losses(
        loss_fn, params, buffers, {"x": x, "y": y}, scale_factor=0.5, input="x"
    )
    assert s.shape == (10,)
    with pytest.raises(TypeError, match="not a callable"):
        sbfunc.score.downsample_batch((x, y), 0.5, input=lambda b: b[0])


def test_loss_with_wrong_leading_dim_rejected():
    _, params, buffers, batch = _setup()
    with pytest.raises(ValueError, match="leading dimension 3 but the batch has 10"):
        sbfunc.score.score_losses(lambda p, b, x: torch.zeros(3), params, buffers, batch)
