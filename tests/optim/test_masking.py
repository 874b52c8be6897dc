"""masked, add_decayed_weights(mask=) and set_to_zero: optax's _masking_test cases on sbfunc's
flat parameter dicts (nested optax trees flattened to dotted keys), the freezing recipe, and
the law that an all-True mask is the inner transformation itself."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc import optim
from tests.helpers import assert_identical
from tests.optim.helpers import assert_steps_identical, grad_sequence, model_params

SETTINGS = settings(max_examples=25, derandomize=True, database=None, deadline=None)

# optax's test tree {'a': 1., 'b': [2., 3.], 'c': {'d': 4., 'e': (5., 6.)}}, flattened
MASK = {"a": True, "b.0": False, "b.1": True, "c.d": True, "c.e.0": False, "c.e.1": True}
PARAMS = {k: torch.tensor(float(i + 1)) for i, k in enumerate(MASK)}


def _sgd():
    return optim.sgd(1.0)


def _stateful_sgd():  # optax's: momentum 0 still keeps (and checks) a state
    return optim.chain(optim.trace(0.0), optim.scale(-1.0))


def _negate_masked(updates):
    return {k: -u if MASK[k] else u for k, u in updates.items()}


@pytest.mark.parametrize("build", [_sgd, _stateful_sgd], ids=["sgd", "stateful_sgd"])
@pytest.mark.parametrize("use_fn", [False, True])
def test_masked(build, use_fn):
    # optax test_masked
    opt = optim.masked(build(), (lambda _: MASK) if use_fn else MASK)
    updates_in = {k: p / 10.0 for k, p in PARAMS.items()}
    state = opt.init(PARAMS)
    updates, state = opt.update(updates_in, state, PARAMS)
    torch.testing.assert_close(updates, _negate_masked(updates_in))
    for k in MASK:  # the masked-out updates are passed through: the same tensors
        if not MASK[k]:
            assert updates[k] is updates_in[k]
    updates2, _ = opt.update(updates, state)  # again, without params
    torch.testing.assert_close(updates2, _negate_masked(_negate_masked(updates_in)))


def test_update_requires_params():
    # optax test_update_requires_params: masked(add_decayed_weights(0.1), mask)
    opt = optim.masked(optim.add_decayed_weights(0.1), MASK)
    params = PARAMS
    updates_in = {k: p / 10.0 for k, p in params.items()}
    state = opt.init(params)
    updates, state = opt.update(updates_in, state, params)
    expected = {k: u + 0.1 * params[k] if MASK[k] else u for k, u in updates_in.items()}
    torch.testing.assert_close(updates, expected)
    params = optim.apply_updates(params, updates)
    again, _ = opt.update(expected, state, params)
    torch.testing.assert_close(
        again, {k: u + 0.1 * params[k] if MASK[k] else u for k, u in expected.items()}
    )
    with pytest.raises(ValueError, match="reads the parameters"):
        opt.update(updates_in, state)


def test_empty():
    # optax test_empty (dict): no parameters at all
    opt = optim.masked(_sgd(), {})
    assert opt.update({}, opt.init({})) == ({}, optim.MaskedState(sbfunc.types.EmptyState()))


@pytest.mark.parametrize("extra_key_in_mask", [False, True])
@pytest.mark.parametrize("use_fn", [False, True])
def test_tree_mismatch_fails(extra_key_in_mask, use_fn):
    # optax test_tree_mismatch_fails
    mask, params = dict(MASK), dict(PARAMS)
    if extra_key_in_mask:
        mask["c.extra"] = True
    else:
        params["c.extra"] = torch.tensor(7.0)
    opt = optim.masked(_sgd(), (lambda _: mask) if use_fn else mask)
    with pytest.raises(ValueError, match="mask must have the keys of the parameters"):
        opt.init(params)


def test_mask_fn():
    # optax test_mask_fn: decay only the parameters of more than one dimension
    params = {"a": torch.ones(1, 2), "b.0": torch.ones(1), "b.1": torch.ones(1, 2, 3)}
    opt = optim.masked(
        optim.add_decayed_weights(0.1), lambda p: {k: v.dim() > 1 for k, v in p.items()}
    )
    grads = {k: 2 * p for k, p in params.items()}
    updates, _ = opt.update(grads, opt.init(params), params)
    torch.testing.assert_close(updates["a"], grads["a"] + 0.1 * params["a"])
    torch.testing.assert_close(updates["b.0"], grads["b.0"])
    torch.testing.assert_close(updates["b.1"], grads["b.1"] + 0.1 * params["b.1"])


@pytest.mark.parametrize("build", [_sgd, _stateful_sgd], ids=["sgd", "stateful_sgd"])
def test_nested_mask(build):
    # optax test_nested_mask (its issue 271): the inner mask sees the keys the outer selected,
    # so as a dict it has those keys (here a function of them)
    params = {}
    for i, n in enumerate((1, 2, 3), start=1):
        params[f"linear_{i}.w"] = torch.zeros(max(1, i - 1), n)
        params[f"linear_{i}.b"] = torch.zeros(n)
    inner = optim.masked(build(), lambda p: {k: not k.startswith("linear_2") for k in p})
    opt = optim.masked(inner, lambda p: {k: v.dim() > 1 for k, v in p.items()})
    updates_in = {k: torch.ones_like(p) for k, p in params.items()}
    updates, _ = opt.update(updates_in, opt.init(params), params)
    negated = {"linear_1.w", "linear_3.w"}
    torch.testing.assert_close(
        updates, {k: -u if k in negated else u for k, u in updates_in.items()}
    )


def test_masked_state_structure():
    # optax test_masked_state_structure: the inner state holds the selected parameters only
    params = {"a.0": torch.ones(1), "a.1.0": torch.ones(2), "a.1.1": torch.ones(3)}
    params |= {"b.c": torch.ones(4), "b.d": torch.ones(5)}
    mask = {"a.0": True, "a.1.0": True, "a.1.1": False, "b.c": False, "b.d": False}
    state = optim.masked(optim.sgd(1.0, momentum=0.9), mask).init(params)
    assert list(state.inner_state[0].momentum_buffer) == ["a.0", "a.1.0"]  # (trace, lr)


def test_add_decayed_weights_mask_is_masked_decay():
    params = model_params()
    no_bias = {k: not k.endswith("bias") for k in params}
    grads = grad_sequence(params, steps=2)
    a = optim.chain(optim.add_decayed_weights(0.1, mask=no_bias), optim.sgd(0.1))
    b = optim.chain(optim.masked(optim.add_decayed_weights(0.1), no_bias), optim.sgd(0.1))
    sa, sb = a.init(params), b.init(params)
    for g in grads:
        ua, sa = a.update(g, sa, params)
        ub, sb = b.update(g, sb, params)
        assert_identical(ua, ub)
    assert repr(optim.add_decayed_weights(0.1, mask={"w": True})) == (
        "masked(inner=add_decayed_weights(weight_decay=0.1), mask={'w': True})"
    )


def test_freezing_recipe_leaves_frozen_parameters_bit_for_bit():
    params = model_params()
    params["0.bias"] = torch.tensor([-0.0, 0.5])  # a -0.0 survives the frozen update
    frozen = {k: k.startswith("0.") for k in params}
    trainable = {k: not f for k, f in frozen.items()}
    opt = optim.chain(
        optim.masked(optim.adamw(0.1), trainable), optim.masked(optim.set_to_zero(), frozen)
    )
    state, p = opt.init(params), params
    for g in grad_sequence(params, steps=3):
        updates, state = opt.update(g, state, p)
        p = optim.apply_updates(p, updates)
    for k in params:
        if frozen[k]:
            assert_identical(p[k], params[k])
        else:
            assert not torch.equal(p[k], params[k])


def test_set_to_zero():
    opt = optim.set_to_zero()
    updates, state = opt.update({"w": torch.tensor([1.0, float("nan")])}, opt.init({}))
    assert_identical(updates, {"w": torch.tensor([-0.0, -0.0])})
    assert state == sbfunc.types.EmptyState() and repr(opt) == "set_to_zero()"


@SETTINGS
@given(
    kind=st.sampled_from(["sgd", "adam", "adamw"]),
    lr=st.sampled_from([0.1, optim.cosine_decay_schedule(0.1, 3)]),
    use_fn=st.booleans(),
)
def test_an_all_true_mask_is_the_inner_transformation(kind, lr, use_fn):
    params = model_params()
    everything = {k: True for k in params}
    inner = getattr(optim, kind)(lr, weight_decay=0.01)
    opt = optim.masked(inner, (lambda p: {k: True for k in p}) if use_fn else everything)
    grads = grad_sequence(params, steps=3)
    assert_steps_identical(opt, inner, params, grads, state_of=lambda s: s.inner_state)


@SETTINGS
@given(st.data())
def test_an_all_false_mask_passes_every_update_through(data):
    params = model_params()
    opt = optim.masked(optim.adam(0.1), {k: False for k in params})
    grads = grad_sequence(params, steps=1)[0]
    updates, state = opt.update(grads, opt.init(params), params)
    assert all(updates[k] is grads[k] for k in grads)
    assert state.inner_state.exp_avg == {}


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: optim.masked(abs, {}), TypeError, "inner must be a GradientTransformation"),
        (lambda: optim.masked(optim.sgd(0.1), [True]), TypeError, "mask must be a dict"),
        (
            lambda: optim.masked(optim.sgd(0.1), {"w": 1}).init({"w": torch.ones(1)}),
            TypeError,
            r"mask\['w'\] must be True or False",
        ),
        (
            lambda: optim.masked(optim.sgd(0.1), lambda p: None).init({"w": torch.ones(1)}),
            TypeError,
            "mask must be a dict",
        ),
        (lambda: optim.add_decayed_weights(0.1, mask=3), TypeError, "mask must be a dict"),
    ],
)
def test_invalid_arguments(build, error, match):
    with pytest.raises(error, match=match):
        build()
