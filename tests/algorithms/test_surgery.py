import re

import pytest
import torch
from torch import nn

from sbfunc.algorithms._surgery import matching_modules, replace_modules, selector


def _net():
    torch.manual_seed(0)
    shared = nn.Linear(3, 3)
    return nn.Sequential(shared, nn.ReLU(), nn.Sequential(shared, nn.Linear(3, 2)))


def _to_gelu(name, m):
    return nn.GELU() if isinstance(m, nn.ReLU) else None


def test_replace_modules_copies_and_never_changes_its_input():
    net = _net()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    new = replace_modules(net, _to_gelu)
    assert isinstance(new[1], nn.GELU) and isinstance(net[1], nn.ReLU)
    assert new[0].weight is not net[0].weight
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in before.items())


def test_replace_modules_replaces_a_shared_module_once():
    net = _net()
    new = replace_modules(net, lambda n, m: nn.Tanh() if m is not None and n == "0" else None)
    assert new[0] is new[2][0] and isinstance(new[0], nn.Tanh)


def test_replace_modules_can_replace_the_root_and_skips_replaced_children():
    seen = []

    def policy(name, m):
        seen.append(name)
        return nn.Identity() if name == "2" else None

    new = replace_modules(_net(), policy)
    assert isinstance(new[2], nn.Identity) and "2.1" not in seen
    assert isinstance(replace_modules(nn.ReLU(), _to_gelu), nn.GELU)


def test_matching_modules_order_and_selector_forms():
    net = _net()
    assert matching_modules(net, selector(nn.Linear)) == ["0", "2.1"]  # shared "2.0" is "0"
    assert matching_modules(net, selector((nn.ReLU, nn.Linear))) == ["0", "1", "2.1"]
    assert matching_modules(net, selector(["1"])) == ["1"]
    assert matching_modules(net, selector(lambda n, m: n.endswith("1"))) == ["1", "2.1"]


@pytest.mark.parametrize("bad", ["0", 3, [1]])
def test_selector_errors(bad):
    with pytest.raises(TypeError, match="target"):
        selector(bad)


# One spelling of a surgery (issue 42, item 1): a `Surgery`, built from its settings and called.
SURGERIES = {
    "Alibi",
    "BlurPool",
    "ChannelsLast",
    "GhostBatchNorm",
    "SqueezeExcite",
    "StochasticDepth",
}


def _public_classes():
    import sbfunc.algorithms as A

    return {n: getattr(A, n) for n in A.__all__ if isinstance(getattr(A, n), type)}


def test_every_surgery_is_a_surgery_called_on_the_model():
    """The classes that change a model are exactly the `Surgery` subclasses, each called on
    the model; no public name spells a surgery another way (an `apply_*` function, a
    `.surgery()` method of its own)."""
    import sbfunc.algorithms as A

    classes = _public_classes()
    surgeries = {n for n, c in classes.items() if issubclass(c, A.Surgery) and c is not A.Surgery}
    assert surgeries == SURGERIES
    assert [n for n in A.__all__ if n.startswith("apply_")] == []
    for name, cls in classes.items():
        assert getattr(cls, "surgery", A.Surgery.surgery) is A.Surgery.surgery, name
        if name in SURGERIES:
            assert "__call__" not in getattr(cls, "__abstractmethods__", ()), name


def _models():
    torch.manual_seed(0)
    conv = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.BatchNorm2d(8), nn.MaxPool2d(2))
    return {
        "apply_alibi": (nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), (32,), {}),
        "apply_blurpool": (conv, (), {"min_channels": 3}),
        "apply_channels_last": (conv, (), {}),
        "apply_ghost_batchnorm": (conv, (2,), {}),
        "apply_squeeze_excite": (conv, (0.5, 3), {}),
        "apply_stochastic_depth": (conv, (nn.BatchNorm2d, "sample", 0.4), {"scale": 0.5}),
    }


def _same(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return (
        [type(m) for m in a.modules()] == [type(m) for m in b.modules()]
        and all(torch.equal(sa[k], sb[k]) for k in sa)
        and sa.keys() == sb.keys()
    )


@pytest.mark.parametrize("name", sorted(_models()))
def test_the_1_1_functions_warn_naming_the_call_and_do_what_they_did(name):
    import sbfunc.algorithms as A
    from sbfunc.algorithms._deprecated import SPELLINGS

    model, args, kwargs = _models()[name]
    with pytest.warns(
        DeprecationWarning, match=re.escape(f"write sbfunc.algorithms.{SPELLINGS[name]}")
    ):
        old = getattr(A, name)
    torch.manual_seed(1)
    out = old(model, *args, **kwargs)
    cls = getattr(A, SPELLINGS[name].partition("(")[0])
    torch.manual_seed(1)
    new = cls(*args, **({} if name == "apply_stochastic_depth" else kwargs))(model)
    if name == "apply_stochastic_depth":  # 1.1's scale: every branch's warm-up factor
        assert {
            float(m.stochastic_depth_scale) for m in out.modules() if hasattr(m, "method")
        } == {0.5}
        assert [float(m.stochastic_depth_rate) for m in out.modules() if hasattr(m, "method")] == [
            float(m.stochastic_depth_rate) for m in new.modules() if hasattr(m, "method")
        ]
    else:
        assert _same(out, new)


def test_the_1_1_surgery_method_warns_and_calls_the_surgery():
    import sbfunc.algorithms as A

    with pytest.warns(DeprecationWarning, match=re.escape("write ChannelsLast(...)(model)")):
        out = A.ChannelsLast().surgery(nn.Conv2d(3, 4, 3))
    assert out.weight.is_contiguous(memory_format=torch.channels_last)
