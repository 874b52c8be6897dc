"""Every transform of ``sbfunc.per_sample`` has one shape (issue 42, item 1):
``f(params, buffers, batch, *, subsampling=None, chunk_size=None, key=None)``, a
``PerSampleTransform``; the Monte-Carlo ones require the key, the exact ones ignore it.
(``ggn_vector_product`` also takes the vector it multiplies.)"""

import re

import pytest
import torch
from torch import nn

import sbfunc
import sbfunc.per_sample as ps

EXACT = ("batch_grad", "batch_l2_grad", "sum_grad_squared", "variance")
EXACT += ("sqrt_ggn_exact", "diag_ggn_exact", "batch_diag_ggn_exact", "ggn_eigen")
MONTE_CARLO = ("sqrt_ggn_mc", "diag_ggn_mc", "batch_diag_ggn_mc")


def _setup():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    loss_fn = sbfunc.per_sample_loss(model, nn.functional.cross_entropy)
    batch = (torch.randn(5, 3), torch.randint(0, 2, (5,)))
    return loss_fn, *sbfunc.split_module(model), batch


def _equal(a, b) -> bool:
    leaves_a, leaves_b = (torch.utils._pytree.tree_leaves(x) for x in (a, b))
    return len(leaves_a) == len(leaves_b) and all(
        torch.equal(x, y) for x, y in zip(leaves_a, leaves_b, strict=True)
    )


@pytest.mark.parametrize("name", EXACT)
def test_an_exact_transform_takes_the_key_and_ignores_it(name):
    loss_fn, params, buffers, batch = _setup()
    f = getattr(ps, name)(loss_fn)
    plain = f(params, buffers, batch, subsampling=[0, 3], chunk_size=1)
    keyed = f(params, buffers, batch, subsampling=[0, 3], chunk_size=1, key=sbfunc.random.key(0))
    assert _equal(plain, keyed)


@pytest.mark.parametrize("name", MONTE_CARLO)
def test_a_monte_carlo_transform_requires_the_key(name):
    loss_fn, params, buffers, batch = _setup()
    f = getattr(ps, name)(loss_fn)
    key = sbfunc.random.key(0)
    one = f(params, buffers, batch, subsampling=[0, 3], chunk_size=1, key=key)
    assert _equal(one, f(params, buffers, batch, subsampling=[0, 3], key=key))
    with pytest.raises(TypeError, match="key"):
        f(params, buffers, batch, subsampling=[0, 3])


def test_the_shapes_are_the_transforms_of_the_face():
    """The face's transforms are the two tuples above and ``ggn_vector_product``; its one
    transform type is ``PerSampleTransform`` (1.1's ``KeyedTransform`` is an alias)."""
    functions = {n for n in ps.__all__ if n[0].islower()}
    assert functions == {*EXACT, *MONTE_CARLO, "ggn_vector_product"}
    message = (
        "sbfunc.per_sample.KeyedTransform was renamed to sbfunc.per_sample.PerSampleTransform"
    )
    with pytest.warns(DeprecationWarning, match=re.escape(message)):
        assert ps.KeyedTransform is ps.PerSampleTransform
