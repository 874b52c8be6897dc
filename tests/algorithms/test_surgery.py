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
