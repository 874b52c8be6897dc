"""optax's spellings and options in sbfunc.optim: ``learning_rate=`` beside torch's ``lr=``,
state dtypes (``mu_dtype``, ``accumulator_dtype``: optax alias_test.test_explicit_dtype),
``polynomial_schedule`` (optax schedule_test.PolynomialTest) and a scheduled ``scale``."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc import optim
from tests.helpers import assert_identical
from tests.optim.helpers import grad_sequence, model_params

SETTINGS = settings(max_examples=20, derandomize=True, database=None, deadline=None)
OPTIMIZERS = ["sgd", "adam", "adamw", "decoupled_sgdw", "decoupled_adamw"]


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_learning_rate_is_lr_in_optax_spelling(name):
    factory = getattr(optim, name)
    schedule = optim.linear_schedule(0.1, 0.01, 3)
    params = model_params()
    for lr in (0.1, schedule):
        a, b = factory(lr), factory(learning_rate=lr)
        assert repr(a) == repr(b)
        sa, sb = a.init(params), b.init(params)
        for g in grad_sequence(params, steps=2):
            ua, sa = a.update(g, sa, params)
            ub, sb = b.update(g, sb, params)
            assert_identical(ua, ub)
    with pytest.raises(TypeError, match=rf"{name}\(\) got both lr and learning_rate"):
        factory(0.1, learning_rate=0.1)
    with pytest.raises(TypeError, match=rf"{name}\(\) needs a learning rate: give lr"):
        factory()
    with pytest.raises(ValueError, match="learning_rate must be"):
        factory(learning_rate=-1.0)


@pytest.mark.parametrize("state_dtype", [torch.bfloat16, torch.float32, None])
@pytest.mark.parametrize("params_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("name", ["sgd_mom", "adam", "adamw"])
def test_explicit_dtype(name, params_dtype, state_dtype):
    # optax alias_test.test_explicit_dtype (real dtypes: sbfunc keeps complex parameters'
    # moments on their real views, so a complex mu_dtype has no meaning here)
    if name == "sgd_mom":
        opt = optim.sgd(0.1, momentum=0.9, accumulator_dtype=state_dtype)
    else:
        opt = getattr(optim, name)(0.1, mu_dtype=state_dtype)
    params = {"w": torch.zeros(2, dtype=params_dtype)}
    state = opt.init(params)
    field = "momentum_buffer" if name == "sgd_mom" else "exp_avg"
    parts = state if type(state) is tuple else (state,)  # a chain's, or a single part's
    kept = next(getattr(part, field) for part in parts if hasattr(part, field))
    assert kept["w"].dtype == (params_dtype if state_dtype is None else state_dtype)
    updates, state = opt.update({"w": torch.ones(2, dtype=params_dtype)}, state, params)
    # computed in the wider dtype (optax's promotion; AdamW's decay then adds in the
    # parameters' dtype), applied in the parameters'
    wider = torch.promote_types(params_dtype, state_dtype or params_dtype)
    assert updates["w"].dtype == (params_dtype if name == "adamw" else wider)
    assert optim.apply_updates(params, updates)["w"].dtype == params_dtype


def _round_between_steps(opt, field, dtype, params, grads):
    """The parameters of ``opt`` with ``state.<field>`` rounded to ``dtype`` (and back) after
    each update: what keeping that state in ``dtype`` means."""
    state, out = opt.init(params), []
    for g in grads:
        updates, state = opt.update(g, state, params)
        params = optim.apply_updates(params, updates)
        rounded = {k: v.to(dtype).to(v.dtype) for k, v in getattr(state, field).items()}
        state = state._replace(**{field: rounded})
        out.append(params)
    return out


@SETTINGS
@given(amsgrad=st.booleans(), dtype=st.sampled_from([torch.bfloat16, torch.float16]))
def test_mu_dtype_only_rounds_the_stored_first_moment(amsgrad, dtype):
    params = model_params()
    grads = grad_sequence(params, steps=4)
    ref = _round_between_steps(
        optim.scale_by_adam(amsgrad=amsgrad), "exp_avg", dtype, params, grads
    )
    opt = optim.scale_by_adam(amsgrad=amsgrad, mu_dtype=dtype)
    state, p = opt.init(params), params
    for g, expected in zip(grads, ref, strict=True):
        updates, state = opt.update(g, state, p)
        p = optim.apply_updates(p, updates)
        assert_identical(p, expected)
        assert {v.dtype for v in state.exp_avg.values()} == {dtype}


@SETTINGS
@given(nesterov=st.booleans(), dtype=st.sampled_from([torch.bfloat16, torch.float16]))
def test_accumulator_dtype_only_rounds_the_stored_momentum(nesterov, dtype):
    params = model_params()
    grads = grad_sequence(params, steps=4)
    plain = optim.trace(0.9, nesterov=nesterov)
    ref = _round_between_steps(plain, "momentum_buffer", dtype, params, grads)
    opt = optim.trace(0.9, nesterov=nesterov, accumulator_dtype=dtype)
    state, p = opt.init(params), params
    for g, expected in zip(grads, ref, strict=True):
        updates, state = opt.update(g, state, p)
        p = optim.apply_updates(p, updates)
        assert_identical(p, expected)


def test_a_wider_state_dtype_computes_in_it():
    # float64 momentum of float32 parameters: the update comes out in float64 (optax's
    # promotion); apply_updates casts it to the parameters' dtype
    opt = optim.trace(0.5, accumulator_dtype=torch.float64)
    state = opt.init({"w": torch.zeros(1)})
    for _ in range(2):
        updates, state = opt.update({"w": torch.tensor([1 / 3])}, state)
    assert updates["w"].dtype == torch.float64
    assert updates["w"].item() == torch.tensor(1 / 3).double().item() * 1.5


def test_state_dtype_reprs_and_checks():
    assert repr(optim.trace(0.9)) == "trace(momentum=0.9, dampening=0.0, nesterov=False)"
    assert repr(optim.trace(0.9, accumulator_dtype=torch.bfloat16)).endswith(
        "accumulator_dtype=torch.bfloat16)"
    )
    assert repr(optim.adam(0.1, mu_dtype=torch.bfloat16)).endswith("mu_dtype=torch.bfloat16)")
    with pytest.raises(TypeError, match=r"mu_dtype must be None .* or a floating torch.dtype"):
        optim.adam(0.1, mu_dtype=torch.int32)
    with pytest.raises(TypeError, match="accumulator_dtype must be None"):
        optim.sgd(0.1, momentum=0.9, accumulator_dtype="bfloat16")
    with pytest.raises(TypeError, match="mu_dtype is for real parameters"):
        optim.adam(0.1, mu_dtype=torch.bfloat16).init({"z": torch.zeros(1, dtype=torch.complex64)})


def test_polynomial_linear():
    # optax PolynomialTest.test_linear
    s = optim.polynomial_schedule(10.0, 20.0, 1, 10)
    expected = list(range(10, 20)) + [20] * 5
    torch.testing.assert_close(
        torch.stack([s(t) for t in range(15)]), torch.tensor(expected, dtype=torch.float64)
    )


@pytest.mark.parametrize("steps", [-1, 0])
def test_polynomial_zero_steps_schedule(steps):
    # optax PolynomialTest.test_zero_steps_schedule
    s = optim.polynomial_schedule(10.0, 20.0, 1, steps)
    assert all(s(t).item() == 10.0 for t in range(15))


def test_polynomial_nonlinear():
    # optax PolynomialTest.test_nonlinear
    s = optim.polynomial_schedule(25.0, 10.0, 2, 10)
    expected = [10.0 + 15.0 * (1.0 - n / 10) ** 2 for n in range(10)] + [10.0] * 5
    torch.testing.assert_close(
        torch.stack([s(t) for t in range(15)]), torch.tensor(expected, dtype=torch.float64)
    )


def test_polynomial_with_decay_begin():
    # optax PolynomialTest.test_with_decay_begin
    s = optim.polynomial_schedule(30.0, 10.0, 2, 10, transition_begin=4)
    expected = [30.0] * 4 + [10.0 + 20.0 * (1.0 - n / 10) ** 2 for n in range(10)] + [10.0] * 6
    torch.testing.assert_close(
        torch.stack([s(t) for t in range(20)]), torch.tensor(expected, dtype=torch.float64)
    )


@SETTINGS
@given(
    init=st.floats(-5, 5),
    end=st.floats(-5, 5),
    steps=st.integers(1, 20),
    begin=st.integers(0, 5),
    count=st.integers(0, 40),
)
def test_polynomial_of_power_one_is_the_linear_schedule(init, end, steps, begin, count):
    poly = optim.polynomial_schedule(init, end, 1, steps, transition_begin=begin)
    linear = optim.linear_schedule(init, end, steps, transition_begin=begin)
    assert_identical(poly(count), linear(count))


def test_polynomial_repr_and_checks():
    assert repr(optim.polynomial_schedule(1, 0, 2, 10)) == (
        "polynomial_schedule(init_value=1.0, end_value=0.0, power=2.0, transition_steps=10, "
        "transition_begin=0)"
    )
    with pytest.raises(ValueError, match="transition_begin must be an int >= 0"):
        optim.polynomial_schedule(1.0, 0.0, 2, 10, transition_begin=-1)
    with pytest.raises(TypeError, match="power must be"):
        optim.polynomial_schedule(1.0, 0.0, "2", 10)


def test_scale_takes_a_schedule():
    opt = optim.scale(optim.linear_schedule(2.0, 0.0, 2))
    state = opt.init({"w": torch.zeros(1)})
    outs = []
    for _ in range(3):
        updates, state = opt.update({"w": torch.ones(1)}, state)
        outs.append(updates["w"].item())
    assert outs == [2.0, 1.0, 0.0]
    assert isinstance(optim.scale(1.0).init({}), sbfunc.types.EmptyState)
    with pytest.raises(TypeError, match="step_size must be a float or a schedule"):
        optim.scale("2")
