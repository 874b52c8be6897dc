"""Invariants of every optimizer, flag combination and wrapper: purity (values and ``_version``),
fixed state structure with 0-d int64 counts, checkpointing against a fresh template, and
per-parameter independence (grouping by dtype)."""

import io

import optree
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc import optim
from tests.helpers import assert_identical

SETTINGS = settings(max_examples=40, derandomize=True, database=None, deadline=None)
LRS = [0.1, 0.0, optim.cosine_decay_schedule(0.1, 4), lambda count: 0.05]
DTYPES = [torch.float32, torch.float64, torch.complex64]
WEIGHT_DECAYS = [0.0, 0.01, optim.constant_schedule(0.02)]


@st.composite
def optimizers(draw, *, wrapped=True):
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
    opt = getattr(optim, kind)(draw(st.sampled_from(LRS)), **kw)
    wrap = draw(st.sampled_from(["none", "finite", "steps", "clip"])) if wrapped else "none"
    if wrap == "finite":
        return optim.apply_if_finite(opt, draw(st.sampled_from([None, 1])))
    if wrap == "steps":
        return optim.multi_steps(opt, draw(st.integers(1, 3)))
    if wrap == "clip":
        return optim.chain(optim.clip_by_global_norm(1.0), opt)
    return opt


@st.composite
def trees(draw):
    """(params, [grads, grads]): 1-3 tensors of small shapes, float32, float64 or complex64
    each."""
    n = draw(st.integers(1, 3))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    shapes = draw(st.lists(st.sampled_from([(), (3,), (2, 3), (1, 2, 2)]), min_size=n, max_size=n))
    dtypes = draw(st.lists(st.sampled_from(DTYPES), min_size=n, max_size=n))

    def rand(s, d):
        return torch.randn(s, generator=gen, dtype=d)

    params = {f"p{i}": rand(s, d) for i, (s, d) in enumerate(zip(shapes, dtypes, strict=True))}
    grads = [{k: rand(v.shape, v.dtype) for k, v in params.items()} for _ in range(2)]
    return params, grads


def _clone(tree):
    return optree.tree_map(lambda t: t.clone(), tree, none_is_leaf=True)


def _versions(tree):
    return [t._version for t in optree.tree_leaves(tree, none_is_leaf=True)]


def _storages(tree):
    return {t.untyped_storage().data_ptr() for t in optree.tree_leaves(tree) if t.numel()}


def _step(opt, g, state, params):
    updates, state = opt.update(g, state, params)
    return optim.apply_updates(params, updates), state


@SETTINGS
@given(optimizers(), trees())
def test_update_is_pure_and_fresh(opt, tree):
    params, (g0, g1) = tree
    p1, state = _step(opt, g0, opt.init(params), params)  # non-zero buffers from here on
    inputs = (g1, state, p1)
    before, versions = _clone(inputs), _versions(inputs)
    out = opt.update(*inputs)
    assert_identical(inputs, before)  # nothing modified, bit for bit
    assert _versions(inputs) == versions  # nor written in place
    assert not _storages(out[0]) & _storages(inputs)  # no update aliases an input


@SETTINGS
@given(optimizers(), trees())
def test_state_structure_is_fixed_from_init_and_counts_are_0d_int64(opt, tree):
    params, grads = tree
    state0 = opt.init(params)

    def signature(state):
        leaves, spec = optree.tree_flatten(state)
        return spec, [(t.shape, t.dtype, t.device) for t in leaves]

    state = state0
    for g in grads:
        params, state = _step(opt, g, state, params)
        assert signature(state) == signature(state0)
    counts = [t for t in optree.tree_leaves(state) if t.dtype == torch.int64]
    assert all(t.dim() == 0 for t in counts)  # (plain SGD keeps no count)


@SETTINGS
@given(optimizers(wrapped=False), trees())
def test_each_parameter_is_updated_independently(opt, tree):
    # one foreach group per dtype must give what each parameter alone gives, bitwise
    params, (g0, _) = tree
    together, _ = _step(opt, g0, opt.init(params), params)
    for k in params:
        alone, _ = _step(opt, {k: g0[k]}, opt.init({k: params[k]}), {k: params[k]})
        assert torch.equal(alone[k], together[k])
        assert alone[k].dtype == params[k].dtype


@settings(max_examples=10, derandomize=True, database=None, deadline=None)
@given(optimizers(), trees())
def test_state_checkpoints_against_a_fresh_template(opt, tree):
    params, grads = tree
    state = opt.init(params)
    for g in grads:
        params, state = _step(opt, g, state, params)
    buf = io.BytesIO()
    sbfunc.checkpoint.save(state, buf)
    buf.seek(0)
    assert_identical(sbfunc.checkpoint.load(buf, like=opt.init(params)), state)


def test_no_parameters():
    for opt in (
        optim.sgd(0.1, momentum=0.9),
        optim.adam(0.1),
        optim.apply_if_finite(optim.adamw(0.1)),
        optim.multi_steps(optim.chain(optim.clip_by_global_norm(1.0), optim.sgd(0.1)), 2),
    ):
        updates, _ = opt.update({}, opt.init({}), {})
        assert updates == {} and optim.apply_updates({}, updates) == {}
