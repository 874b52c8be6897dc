"""Invariants of every optimizer and flag combination: purity, fixed state structure,
checkpointing against a fresh template, and per-parameter independence (grouping by dtype)."""

import io

import optree
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc import optim

SETTINGS = settings(max_examples=40, derandomize=True, database=None, deadline=None)
LRS = [0.1, optim.cosine_decay_schedule(0.1, 4), lambda count: 0.05]
WEIGHT_DECAYS = [0.0, 0.01, optim.constant_schedule(0.02)]


@st.composite
def optimizers(draw):
    kind = draw(st.sampled_from(["sgd", "decoupled_sgdw", "adam", "adamw", "decoupled_adamw"]))
    kw = {
        "weight_decay": draw(st.sampled_from(WEIGHT_DECAYS)),
        "maximize": draw(st.booleans()),
    }
    if "sgd" in kind:
        kw["momentum"] = draw(st.sampled_from([0.0, 0.9]))
        kw["nesterov"] = kw["momentum"] > 0 and draw(st.booleans())
        kw["dampening"] = 0.0 if kw["nesterov"] else draw(st.sampled_from([0.0, 0.3]))
    else:
        kw["amsgrad"] = draw(st.booleans())
    if kind.startswith("decoupled"):
        kw["initial_lr"] = 0.1
    return getattr(optim, kind)(draw(st.sampled_from(LRS)), **kw)


@st.composite
def trees(draw):
    """(params, [grads, grads]): 1-3 tensors of small shapes, float32 or float64 each."""
    n = draw(st.integers(1, 3))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    shapes = draw(st.lists(st.sampled_from([(), (3,), (2, 3), (1, 2, 2)]), min_size=n, max_size=n))
    dtypes = draw(
        st.lists(st.sampled_from([torch.float32, torch.float64]), min_size=n, max_size=n)
    )

    def rand(s, d):
        return torch.randn(s, generator=gen, dtype=d)

    params = {f"p{i}": rand(s, d) for i, (s, d) in enumerate(zip(shapes, dtypes, strict=True))}
    grads = [{k: rand(v.shape, v.dtype) for k, v in params.items()} for _ in range(2)]
    return params, grads


def _clone(tree):
    return optree.tree_map(lambda t: t.clone(), tree, none_is_leaf=True)


def _equal(a, b):
    la, sa = optree.tree_flatten(a)
    lb, sb = optree.tree_flatten(b)
    return sa == sb and all(
        x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(la, lb, strict=False)
    )


def _storages(tree):
    return {t.untyped_storage().data_ptr() for t in optree.tree_leaves(tree) if t.numel()}


@SETTINGS
@given(optimizers(), trees())
def test_update_is_pure_and_fresh(opt, tree):
    params, (g0, g1) = tree
    p1, state = opt.update(g0, opt.init(params), params)  # non-zero buffers from here on
    inputs = (g1, state, p1)
    before = _clone(inputs)
    out = opt.update(*inputs)
    assert _equal(inputs, before)  # nothing modified, bitwise
    assert not _storages(out) & _storages(inputs)  # no output aliases an input


@SETTINGS
@given(optimizers(), trees())
def test_state_structure_is_fixed_from_init(opt, tree):
    params, grads = tree
    state0 = opt.init(params)

    def signature(state):
        leaves, spec = optree.tree_flatten(state)
        return spec, [(t.shape, t.dtype, t.device) for t in leaves]

    state = state0
    for g in grads:
        params, state = opt.update(g, state, params)
        assert signature(state) == signature(state0)
    assert state.count.dtype == torch.int64 and state.count.dim() == 0
    assert int(state.count) == len(grads)


@SETTINGS
@given(optimizers(), trees())
def test_each_parameter_is_updated_independently(opt, tree):
    # one foreach group per dtype must give what each parameter alone gives, bitwise
    params, (g0, _) = tree
    together, _ = opt.update(g0, opt.init(params), params)
    for k in params:
        alone, _ = opt.update({k: g0[k]}, opt.init({k: params[k]}), {k: params[k]})
        assert torch.equal(alone[k], together[k])
        assert alone[k].dtype == params[k].dtype


@settings(max_examples=10, derandomize=True, database=None, deadline=None)
@given(optimizers(), trees())
def test_state_checkpoints_against_a_fresh_template(opt, tree):
    params, grads = tree
    state = opt.init(params)
    for g in grads:
        params, state = opt.update(g, state, params)
    buf = io.BytesIO()
    sbfunc.checkpoint.save(state, buf)
    buf.seek(0)
    assert _equal(sbfunc.checkpoint.load(buf, like=opt.init(params)), state)


def test_no_parameters():
    for opt in (optim.sgd(0.1, momentum=0.9), optim.adam(0.1)):
        params, state = opt.update({}, opt.init({}), {})
        assert params == {} and int(state.count) == 1
