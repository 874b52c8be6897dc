import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from sbfunc.per_sample._layers import conv_contraction, conv_layer, linear_contraction

SETTINGS = settings(derandomize=True, max_examples=25, deadline=None)
CONVS = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def per_sample_weight_grads(layer, x, w, g):
    """Reference: one autograd call per sample of ``sum(layer(x_i, w) * g_i)``."""
    rows = []
    for i in range(x.shape[0]):
        wi = w.detach().requires_grad_()
        (layer(x[i : i + 1], wi) * g[i : i + 1]).sum().backward()
        rows.append(wi.grad)
    return torch.stack(rows)


def check(contraction, reference, g):
    gc = contraction.out_grad(g)
    torch.testing.assert_close(contraction.weight_grads(gc), reference)
    norms = reference.flatten(1).square().sum(1)
    torch.testing.assert_close(contraction.weight_sq_norms(gc), norms)
    torch.testing.assert_close(contraction.weight_sum_sq(gc), reference.square().sum(0))
    torch.testing.assert_close(contraction.weight_sum(gc), reference.sum(0))


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@SETTINGS
@given(
    d=st.integers(1, 3),
    groups=st.sampled_from([1, 2]),
    k=st.integers(1, 3),
    stride=st.integers(1, 2),
    dilation=st.integers(1, 2),
    padding=st.sampled_from([0, 1, "same", "valid"]),
    seed=st.integers(0, 2**16),
)
def test_conv_contraction_matches_autograd(d, groups, k, stride, dilation, padding, seed):
    if padding == "same":
        stride = 1  # torch allows 'same' only with stride 1
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 2 * groups, *[5] * d, generator=gen, dtype=torch.float64)
    w = torch.randn(2 * groups, 2, *[k] * d, generator=gen, dtype=torch.float64)
    conv = CONVS[d]

    def layer(xi, wi):
        return conv(xi, wi, None, stride, padding, dilation, groups)

    g = torch.randn_like(layer(x, w))
    pad = (padding,) * d if isinstance(padding, int) else padding
    ref = per_sample_weight_grads(layer, x, w, g)
    args = ((stride,) * d, pad, (dilation,) * d, groups)
    check(conv_contraction(x, w.shape, *args), ref, g)  # unfolded patches (Gram norms)
    check(conv_layer(x, w, *args), ref, g)  # grouped convolution_backward


@SETTINGS
@given(
    seq=st.lists(st.integers(1, 4), max_size=2),
    i=st.integers(1, 4),
    o=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_linear_contraction_matches_autograd(seq, i, o, seed):
    """Covers the 2-D identity, the Gram form (T^2 <= I*O) and the materialized branch."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(3, *seq, i, generator=gen, dtype=torch.float64)
    w = torch.randn(o, i, generator=gen, dtype=torch.float64)
    g = torch.randn(3, *seq, o, generator=gen, dtype=torch.float64)
    check(linear_contraction(x, w), per_sample_weight_grads(F.linear, x, w, g), g)
