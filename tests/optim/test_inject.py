"""inject_hyperparams: optax's schedules/_inject_test cases ported to sbfunc (where sbfunc's
transformations take the hyperparameter as a schedule), optax's alias_test case that the
wrapped optimizer's state has the plain one's structure, the law that constant
hyperparameters give the plain optimizer bit for bit, and a compiled update that compiles
once."""

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._dynamo.utils import counters

import sbfunc
from sbfunc import optim
from tests.optim.helpers import (
    assert_steps_identical,
    assert_trees_all_close,
    grad_sequence,
    model_params,
)

SETTINGS = settings(max_examples=20, derandomize=True, database=None, deadline=None)


def _params(*shapes):
    return {f"p{i}": torch.zeros(s) for i, s in enumerate(shapes)}


def test_updates():
    # optax test_updates: a scheduled step size of the stateless scale
    schedule = optim.piecewise_constant_schedule(3.0, {1: 5, 7: 2, 12: 1.5})
    opt = optim.inject_hyperparams(optim.scale)(step_size=schedule)
    params = _params(())
    state = opt.init(params)
    expected = [3.0] * 2 + [15.0] * 6 + [30.0] * 5 + [45.0] * 3
    for i in range(15):
        updates, state = opt.update({"p0": torch.ones(())}, state, params)
        torch.testing.assert_close(updates["p0"], torch.tensor(expected[i + 1]))


def test_hyperparams_state():
    # optax test_hyperparams_state, on the scheduled weight decay of add_decayed_weights
    # (optax schedules trace's decay; sbfunc's trace takes its momentum as a number)
    schedule = optim.piecewise_constant_schedule(0.8, {3: 0.5, 9: 1.25})
    opt = optim.inject_hyperparams(optim.add_decayed_weights)(weight_decay=schedule)
    params = {f"p{i}": torch.zeros(2, 3) for i in range(3)}
    state = opt.init(params)
    expected = [0.8] * 4 + [0.4] * 6 + [0.5] * 2
    grads = {k: torch.ones_like(p) for k, p in params.items()}
    for i in range(12):
        torch.testing.assert_close(state.hyperparams["weight_decay"].item(), expected[i])
        _, state = opt.update(grads, state, params)
    torch.testing.assert_close(state.hyperparams["weight_decay"].item(), expected[-1])


def test_constant_hyperparams():
    # optax test_constant_hyperparams: b1 = b2 = 0 make Adam's update g / (|g| + eps), ones;
    # sbfunc's b1, b2 and eps are Python numbers in torch's kernels: fixed, not in the state
    opt = optim.inject_hyperparams(optim.scale_by_adam)(b1=0.0, b2=0.0)
    params = {f"p{i}": torch.zeros(2, 3) for i in range(3)}
    state = opt.init(params)
    grads = {k: torch.ones_like(p) for k, p in params.items()}
    for _ in range(5):
        updates, state = opt.update(grads, state, params)
        torch.testing.assert_close(updates, grads)
    assert state.hyperparams == {}  # (learning_rate=None is not a number)


def test_overriding_hyperparam():
    # optax test_overriding_hyperparam, on sgd's learning rate (sbfunc's clip_by_global_norm
    # takes max_norm as a number): the value set in the state is the next update's
    opt = optim.inject_hyperparams(optim.sgd)(0.1)
    params = {"w": torch.zeros(3, 5, 7)}
    state = opt.init(params)
    grads = {"w": torch.ones(3, 5, 7) / (3 * 5 * 7) ** 0.5}  # norm 1
    for i in range(5):
        state = state._replace(hyperparams={**state.hyperparams, "lr": torch.tensor(float(i))})
        updates, state = opt.update(grads, state, params)
        assert torch.linalg.vector_norm(updates["w"]).item() == pytest.approx(i, rel=1e-6)


@pytest.mark.parametrize("static_args", ["mask", ["mask"]])
def test_static_args(static_args):
    # optax test_static_args: a callable that is not a schedule is named static
    @functools.partial(optim.inject_hyperparams, static_args=static_args)
    def custom_optim(learning_rate, mask):
        return optim.masked(optim.scale_by_learning_rate(learning_rate), mask)

    opt = custom_optim(0.1, lambda p: {k: v.dim() > 1 for k, v in p.items()})
    params = {"a": torch.ones(1, 2), "b": torch.ones(2), "c": torch.ones(1, 1, 1)}
    state = opt.init(params)
    updates, state = opt.update(params, state)
    assert set(state.hyperparams) == {"learning_rate"}
    torch.testing.assert_close(
        updates, {k: -0.1 * x if x.dim() > 1 else x for k, x in params.items()}
    )


@pytest.mark.parametrize("static_args", ["weight_decay", ["weight_decay", "lr"]])
def test_numeric_static_args(static_args):
    # optax test_numeric_static_args (on sgd's numbers; optax's are scale_by_adam's b1, b2)
    opt = optim.inject_hyperparams(optim.sgd, static_args=static_args)(0.1, weight_decay=0.1)
    params = {"a": torch.ones(1, 2), "b": torch.ones(2)}
    _, state = opt.update(params, opt.init(params), params)
    names = {static_args} if isinstance(static_args, str) else set(static_args)
    assert not set(state.hyperparams) & names


def test_prng_key_not_hyperparameter():
    # optax test_prng_key_not_hyperparameter: a key (an int64 tensor) is not a number
    def random_noise(key: torch.Tensor, scale: float) -> optim.GradientTransformation:
        def init(params):
            return (key, torch.tensor(scale))

        def update(updates, state, params=None):
            key, scale = state
            keys = sbfunc.random.split(key, len(updates) + 1)
            noise = {
                k: scale * sbfunc.random.normal(keys[i], u.shape)
                for i, (k, u) in enumerate(updates.items())
            }
            return noise, (keys[-1], scale)

        return optim.GradientTransformation(init, update)

    opt = optim.inject_hyperparams(random_noise)(key=sbfunc.random.key(17), scale=1e-3)
    params = {"a": torch.ones(1, 2), "b": torch.ones(2)}
    _, state = opt.update(params, opt.init(params))
    assert set(state.hyperparams) == set()  # scale is annotated float: fixed


@pytest.mark.parametrize("hyperparam_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    ("param_dtype", "grad_dtype"),
    [
        (torch.float32, torch.bfloat16),
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.float32),
    ],
)
def test_hyperparam_dtypes(hyperparam_dtype, param_dtype, grad_dtype):
    # optax test_hyperparam_dtypes (on sgd's learning rate and weight decay)
    opt = optim.inject_hyperparams(optim.sgd, hyperparam_dtype=hyperparam_dtype)(
        0.1, weight_decay=0.01
    )
    params = {"a": torch.ones(1, 2, dtype=param_dtype), "b": torch.ones(2, dtype=param_dtype)}
    state = opt.init(params)
    assert {v.dtype for v in state.hyperparams.values()} == {hyperparam_dtype}
    grads = {k: p.to(grad_dtype) for k, p in params.items()}
    _, state = opt.update(grads, state, params)
    assert {v.dtype for v in state.hyperparams.values()} == {hyperparam_dtype}


def test_hyperparam_default_dtype():
    # optax test_hyperparam_default_dtype, with sbfunc's default: float64 (a Python float's
    # precision; optax uses the parameters' dtype), and a tensor keeps its own dtype
    params = {"a": torch.ones(1, 2, dtype=torch.bfloat16)}
    state = optim.inject_hyperparams(optim.sgd)(0.1).init(params)
    assert state.hyperparams["lr"].dtype == torch.float64
    opt = optim.inject_hyperparams(optim.sgd)(
        torch.tensor(0.1, dtype=torch.float32), weight_decay=torch.tensor(0.0).bfloat16()
    )
    state = opt.init(params)
    assert state.hyperparams["lr"].dtype == torch.float32
    assert state.hyperparams["weight_decay"].dtype == torch.bfloat16


@pytest.mark.parametrize("static_args", ["lr", ["lr"]])
def test_static_args_error(static_args):
    # optax test_static_args_error: scale has no argument lr
    with pytest.raises(ValueError, match="static_args must name arguments of inner_factory"):
        optim.inject_hyperparams(optim.scale, static_args=static_args)


def test_inject_hyperparams_starts_with_step_count_zero():
    # optax test_inject_hyperparams_starts_with_step_count_zero (its issue 415)
    opt = optim.inject_hyperparams(optim.scale)(lambda count: count)
    updates, _ = opt.update({"w": torch.tensor([-1.0, 0.0, 1.0])}, opt.init({"w": torch.zeros(3)}))
    assert torch.equal(updates["w"], torch.zeros(3))


def test_a_scheduled_value_is_stored_and_overwritten():
    opt = optim.inject_hyperparams(optim.sgd)(learning_rate=optim.linear_schedule(1.0, 0.0, 4))
    params = {"w": torch.zeros(1)}
    state = opt.init(params)
    assert state.hyperparams["learning_rate"].item() == 1.0  # the value at step 0
    state = state._replace(hyperparams={**state.hyperparams, "learning_rate": 7.0})
    updates, state = opt.update({"w": torch.ones(1)}, state, params)
    assert updates["w"].item() == -1.0  # a schedule is not overridden from the state
    _, state = opt.update({"w": torch.ones(1)}, state, params)
    assert state.hyperparams["learning_rate"].item() == 0.75 and int(state.count) == 2


OPTIMIZERS = {  # (unannotated **kw: injected, as optax injects every number)
    "sgd": lambda wd, **kw: optim.sgd(momentum=0.9, weight_decay=wd, **kw),
    "adam": lambda wd, **kw: optim.adam(weight_decay=wd, amsgrad=True, **kw),
    "adamw": lambda wd, **kw: optim.adamw(weight_decay=wd, **kw),
}


# optax alias_test._OPTIMIZERS_UNDER_TEST, the optimizers sbfunc has (optax's amsgrad is
# sbfunc's adam(amsgrad=True); sbfunc's adamw keeps torch's default weight decay)
ALIAS_CASES = {
    "adam": (optim.adam, {"learning_rate": 1e-1}),
    "adamw": (optim.adamw, {"learning_rate": 1e-1}),
    "amsgrad": (optim.adam, {"learning_rate": 1e-1, "amsgrad": True}),
    "sgd": (optim.sgd, {"learning_rate": 1e-3, "momentum": 0.9}),
}


@pytest.mark.parametrize("name", sorted(ALIAS_CASES))
def test_optimizers_can_be_wrapped_in_inject_hyperparams(name):
    # optax alias_test.test_optimizers_can_be_wrapped_in_inject_hyperparams, its inputs and
    # tolerances: the updates within rtol=1e-3, the inner state of the plain state's structure
    # within rtol=1e-4 (1.1: a step count per injected value, and adam's weight_decay=0 a part)
    factory, kwargs = ALIAS_CASES[name]
    opt, opt_inject = factory(**kwargs), optim.inject_hyperparams(factory)(**kwargs)
    params = {"0": -torch.ones(2, 3), "1": torch.ones(2, 5, 2)}
    grads = {"0": torch.ones(2, 3), "1": -torch.ones(2, 5, 2)}
    updates, new_state = opt.update(grads, opt.init(params), params)
    updates_inject, new_state_inject = opt_inject.update(grads, opt_inject.init(params), params)
    assert_trees_all_close(updates_inject, updates, rtol=1e-3)
    assert_trees_all_close(new_state_inject.inner_state, new_state, rtol=1e-4)


SBFUNC_CASES = {  # the same law for the rest of sbfunc's optimizers and their weight decays
    "adam-l2": (optim.adam, {"lr": 0.1, "weight_decay": 0.1, "maximize": True}),
    "adamw-no-decay": (optim.adamw, {"lr": 0.1, "weight_decay": 0.0}),
    "decoupled_adamw": (optim.decoupled_adamw, {"lr": 0.1}),
    "decoupled_sgdw": (
        optim.decoupled_sgdw,
        {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-2},
    ),
    "sgd-l2-nesterov": (
        optim.sgd,
        {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-2},
    ),
    "scale": (optim.scale, {"step_size": -0.5}),
    "add_decayed_weights": (optim.add_decayed_weights, {"weight_decay": 0.1}),
}


@pytest.mark.parametrize("name", sorted(SBFUNC_CASES))
def test_every_optimizer_keeps_the_plain_state_structure(name):
    factory, kwargs = SBFUNC_CASES[name]
    opt, injected = factory(**kwargs), optim.inject_hyperparams(factory)(**kwargs)
    params = model_params()
    p, s, p_inj, s_inj = params, opt.init(params), params, injected.init(params)
    for g in grad_sequence(params, steps=3):
        u, s = opt.update(g, s, p)
        u_inj, s_inj = injected.update(g, s_inj, p_inj)
        p, p_inj = optim.apply_updates(p, u), optim.apply_updates(p_inj, u_inj)
        # (a coupled decay rounds once more from a tensor: see the next test)
        assert_trees_all_close(s_inj.inner_state, s, rtol=1e-5, atol=1e-7)
        assert_trees_all_close(p_inj, p, rtol=1e-5, atol=1e-7)


def test_a_zero_that_leaves_a_part_out_stays_fixed():
    params = {"w": torch.ones(2)}
    opt = optim.inject_hyperparams(optim.adam)(0.1)  # weight_decay=0: no decay part
    state = opt.init(params)
    assert set(state.hyperparams) == {"lr"}
    assert isinstance(state.inner_state, optim.ScaleByAdamState)
    decayed = {**state.hyperparams, "weight_decay": torch.tensor(0.5, dtype=torch.float64)}
    with pytest.raises(ValueError, match=r"must have the names \['lr'\], got \['lr', 'weig"):
        opt.update(params, state._replace(hyperparams=decayed), params)
    # a 0-d tensor is injected (the part is there, stateless), and so is a learning rate of 0
    opt = optim.inject_hyperparams(optim.adam)(0.0, weight_decay=torch.tensor(0.0))
    state = opt.init(params)
    assert set(state.hyperparams) == {"lr", "weight_decay"}
    assert state.inner_state[0] == sbfunc.types.EmptyState()
    state = state._replace(hyperparams={"lr": torch.tensor(0.1), **decayed})
    updates, _ = opt.update(params, state, params)
    plain = optim.adam(0.1, weight_decay=0.5)
    torch.testing.assert_close(updates, plain.update(params, plain.init(params), params)[0])


@SETTINGS
@given(
    kind=st.sampled_from(sorted(OPTIMIZERS)),
    lr=st.sampled_from([0.1, 1e-3, 0.0]),
    wd=st.sampled_from([0.0, 0.05]),
    spelling=st.sampled_from(["lr", "learning_rate"]),
)
def test_constant_hyperparameters_give_the_plain_optimizer_bit_for_bit(kind, lr, wd, spelling):
    # an injected value is a tensor: a coupled (L2) weight decay then multiplies and adds, as
    # with a schedule, where a float fuses the two (one rounding apart)
    # (the states then differ by the schedule's step count: compared where they do not)
    coupled = wd != 0 and kind != "adamw"
    plain = OPTIMIZERS[kind](optim.constant_schedule(wd) if coupled else wd, lr=lr)
    injected = optim.inject_hyperparams(OPTIMIZERS[kind])(**{spelling: lr}, wd=wd)
    params = model_params()
    state_of = None if coupled else (lambda s: s.inner_state)
    assert_steps_identical(
        injected, plain, params, grad_sequence(params, steps=4), state_of=state_of
    )


@SETTINGS
@given(
    schedule=st.sampled_from(
        [optim.cosine_decay_schedule(0.1, 3), optim.linear_schedule(0.1, 0, 2)]
    )
)
def test_a_schedule_gives_the_optimizer_built_with_it_bit_for_bit(schedule):
    # the inner state is the one built with the schedule's values, as optax's: Adam's moments
    # alike, the decay part without the schedule's step count
    plain = optim.adamw(schedule, weight_decay=0.1)
    injected = optim.inject_hyperparams(optim.adamw)(schedule, weight_decay=0.1)
    params = model_params()
    grads = grad_sequence(params, steps=4)
    assert_steps_identical(
        injected,
        plain,
        params,
        grads,
        state_of=lambda s: s.inner_state,
        ref_state_of=lambda s: (s[0], sbfunc.types.EmptyState()),
    )


def test_compiled_update_compiles_once_while_the_learning_rate_changes():
    torch._dynamo.reset()
    counters.clear()
    opt = optim.inject_hyperparams(optim.adamw)(
        learning_rate=optim.cosine_decay_schedule(1e-2, 4), weight_decay=0.1
    )
    params = model_params()
    update = torch.compile(opt.update, fullgraph=True)
    eager_p, eager_s, comp_p, comp_s = params, opt.init(params), params, opt.init(params)
    for i, g in enumerate(grad_sequence(params, steps=4)):
        comp_s = comp_s._replace(
            hyperparams={
                **comp_s.hyperparams,
                "weight_decay": torch.tensor(0.1 * i, dtype=torch.float64),
            }
        )
        eager_s = eager_s._replace(hyperparams=comp_s.hyperparams)
        eager_u, eager_s = opt.update(g, eager_s, eager_p)
        comp_u, comp_s = update(g, comp_s, comp_p)
        eager_p, comp_p = (
            optim.apply_updates(eager_p, eager_u),
            optim.apply_updates(comp_p, comp_u),
        )
        torch.testing.assert_close(comp_p, eager_p, rtol=1e-6, atol=1e-7)
    assert counters["stats"]["unique_graphs"] == 1
    torch._dynamo.reset()


def test_repr_and_signature():
    factory = optim.inject_hyperparams(optim.adam)
    assert repr(factory(learning_rate=0.1)) == "inject_hyperparams(adam)(learning_rate=0.1)"
    assert "learning_rate" in str(__import__("inspect").signature(factory))


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: optim.inject_hyperparams(3), TypeError, "inner_factory must be callable"),
        (
            lambda: optim.inject_hyperparams(optim.sgd, hyperparam_dtype=torch.int64),
            TypeError,
            "hyperparam_dtype must be None",
        ),
        (
            lambda: optim.inject_hyperparams(optim.adam)(0.1, b1=lambda count: 0.9),
            TypeError,
            "b1 of adam takes no schedule",
        ),
        (lambda: optim.inject_hyperparams(optim.sgd)(-0.1), ValueError, "lr must be"),
        (
            lambda: optim.inject_hyperparams(optim.sgd)(0.1, learning_rate=0.1),
            TypeError,
            "got both lr and learning_rate",
        ),
    ],
)
def test_invalid_arguments(build, error, match):
    with pytest.raises(error, match=match):
        build()
