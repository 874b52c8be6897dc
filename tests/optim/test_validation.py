"""Construction-time validation of the optimizers, their reprs and their input checks."""

import math

import pytest
import torch

import sbfunc
from sbfunc import optim
from tests.optim.helpers import assert_same, grad_sequence, model_params, run_ours, run_torch


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: optim.sgd(-1e-3), ValueError, "lr must be a finite float >= 0"),
        (lambda: optim.adam(-1e-3), ValueError, "lr must be a finite float >= 0"),
        (lambda: optim.decoupled_adamw(-0.1, initial_lr=0.1), ValueError, "lr must be"),
        (lambda: optim.sgd(-1), ValueError, "lr must be"),
        (lambda: optim.sgd(math.nan), ValueError, "lr must be"),
        (lambda: optim.sgd("0.1"), TypeError, "lr must be a float >= 0.0 or a schedule"),
        (lambda: optim.sgd(True), TypeError, "lr must be"),
        (lambda: optim.sgd(0.1, momentum=-0.1), ValueError, "momentum"),
        (lambda: optim.sgd(0.1, dampening=1.5), ValueError, "dampening"),
        (lambda: optim.sgd(0.1, weight_decay=-1e-4), ValueError, "weight_decay"),
        (lambda: optim.sgd(0.1, nesterov=True), ValueError, "nesterov=True needs momentum > 0"),
        (
            lambda: optim.sgd(0.1, momentum=0.9, dampening=0.1, nesterov=True),
            ValueError,
            "dampening == 0",
        ),
        (lambda: optim.sgd(0.1, nesterov=1), TypeError, "nesterov must be True or False"),
        (lambda: optim.sgd(0.1, maximize=None), TypeError, "maximize must be True or False"),
        (
            lambda: optim.adam(0.1, b1=1.0),
            ValueError,
            r"b1 must be in \[0, 1\)",
        ),
        (lambda: optim.adam(0.1, b2=-0.1), ValueError, "b2"),
        (lambda: optim.adam(0.1, eps=-1e-8), ValueError, "eps"),
        (lambda: optim.adamw(0.1, weight_decay="x"), TypeError, "weight_decay"),
        (lambda: optim.adam(0.1, amsgrad="yes"), TypeError, "amsgrad must be True or False"),
        (lambda: optim.decoupled_adamw(0.1, initial_lr=-1.0), ValueError, "initial_lr"),
        (lambda: optim.decoupled_sgdw(0.1, initial_lr="a"), TypeError, "initial_lr"),
        (
            lambda: optim.decoupled_sgdw(0.0, weight_decay=0.1),
            ValueError,
            "initial_lr is needed: lr is 0.0",
        ),
    ],
)
def test_invalid_arguments(build, error, match):
    with pytest.raises(error, match=match):
        build()


def test_update_checks_the_gradient_keys():
    opt = optim.adam(0.1)
    params = {"a": torch.ones(1), "b": torch.ones(1)}
    with pytest.raises(ValueError, match=r"missing \['b'\], unexpected \['c'\]"):
        opt.update({"a": torch.ones(1), "c": torch.ones(1)}, opt.init(params), params)
    with pytest.raises(TypeError, match="dicts of tensors"):
        opt.update([torch.ones(1)], opt.init(params), params)


def test_reprs_read_as_the_call():
    assert repr(optim.sgd(1, momentum=0.9, nesterov=True)) == (
        "sgd(lr=1.0, momentum=0.9, dampening=0.0, nesterov=True, weight_decay=0.0, maximize=False)"
    )
    assert repr(optim.adamw(optim.constant_schedule(1e-3))) == (
        "adamw(lr=constant_schedule(value=0.001), b1=0.9, b2=0.999, eps=1e-08, "
        "weight_decay=0.01, amsgrad=False, maximize=False)"
    )
    assert repr(optim.decoupled_sgdw(0.1, weight_decay=1e-4)) == (
        "decoupled_sgdw(lr=0.1, momentum=0.0, dampening=0.0, nesterov=False, "
        "weight_decay=0.0001, maximize=False, initial_lr=0.1)"
    )
    plain = optim.GradientTransformation(abs, abs)
    assert repr(plain).startswith("GradientTransformation(init=<built-in function abs>")
    assert repr(optim.chain(optim.scale(2.0), optim.scale_by_learning_rate(0.1))) == (
        "chain(scale(step_size=2.0), scale_by_learning_rate(learning_rate=0.1, flip_sign=True))"
    )


def test_a_transformation_is_a_namedtuple_of_init_and_update():
    init, update = optim.sgd(0.1)
    assert callable(init) and callable(update)
    assert optim.GradientTransformation._fields == ("init", "update")
    assert optim.Optimizer is optim.GradientTransformation  # the former name


def test_chain_checks_its_parts_and_its_state():
    with pytest.raises(TypeError, match=r"transforms\[1\] must be a GradientTransformation"):
        optim.chain(optim.scale(1.0), object())
    opt = optim.chain(optim.scale(1.0), optim.scale(2.0))
    with pytest.raises(ValueError, match=r"a tuple of 2 states .* got 1 states"):
        opt.update({"w": torch.ones(1)}, (sbfunc.types.EmptyState(),))


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: optim.scale("2"), TypeError, "step_size"),
        (lambda: optim.scale_by_learning_rate(-0.1), ValueError, "learning_rate must be"),
        (lambda: optim.scale_by_adam(learning_rate=-0.1), ValueError, "learning_rate must"),
        (
            lambda: optim.decoupled_weight_decay(0.1, learning_rate=-1.0),
            ValueError,
            "learning_rate must be",
        ),
        (lambda: optim.scale_by_learning_rate(0.1, flip_sign=1), TypeError, "flip_sign"),
        (lambda: optim.add_decayed_weights(-1.0), ValueError, "weight_decay"),
        (lambda: optim.decoupled_weight_decay(0.1, initial_lr=0.0), ValueError, "initial_lr"),
        (lambda: optim.clip_by_global_norm(0.0), ValueError, "max_norm"),
        (
            lambda: optim.clip_by_global_norm(1.0, formula="exact"),
            ValueError,
            "formula must be one of 'optax', 'torch', got 'exact'",
        ),
        (lambda: optim.clip_by_global_norm(1.0, formula=None), ValueError, "formula must be"),
        (lambda: optim.trace(0.9, dampening=0.5, nesterov=True), ValueError, "nesterov"),
        (lambda: optim.scale_by_adam(b1=1.0), ValueError, "b1"),
        (lambda: optim.apply_if_finite(optim.scale(1.0), -1), ValueError, "max_consecutive"),
        (lambda: optim.apply_if_finite(abs), TypeError, "inner must be"),
        (lambda: optim.multi_steps(optim.scale(1.0), 0), ValueError, "every_k"),
        (lambda: optim.multi_steps(optim.scale(1.0), 2.0), TypeError, "every_k"),
    ],
)
def test_invalid_transformation_arguments(build, error, match):
    with pytest.raises(error, match=match):
        build()


def test_transformations_that_read_the_parameters_say_so():
    for opt in (optim.add_decayed_weights(0.1), optim.decoupled_weight_decay(0.1)):
        with pytest.raises(ValueError, match="reads the parameters"):
            opt.update({"w": torch.ones(1)}, opt.init({"w": torch.ones(1)}))


ZERO_LR = [  # (ours, torch's or None): a zero learning rate, as torch.optim and optax allow
    (lambda: optim.sgd(0.0), lambda ps: torch.optim.SGD(ps, lr=0.0)),
    (
        lambda: optim.sgd(0.0, momentum=0.9, nesterov=True, weight_decay=0.1),
        lambda ps: torch.optim.SGD(ps, lr=0.0, momentum=0.9, nesterov=True, weight_decay=0.1),
    ),
    (lambda: optim.adam(0.0, amsgrad=True), lambda ps: torch.optim.Adam(ps, lr=0.0, amsgrad=True)),
    (lambda: optim.adamw(0.0), lambda ps: torch.optim.AdamW(ps, lr=0.0)),
    (lambda: optim.decoupled_sgdw(0.0, momentum=0.9, weight_decay=0.1, initial_lr=0.1), None),
    (lambda: optim.decoupled_adamw(0.0, initial_lr=0.1), None),
    (lambda: optim.scale_by_learning_rate(0.0), None),
    (lambda: optim.scale_by_adam(learning_rate=0.0), None),
    (  # the decay alone: no decay at lr 0
        lambda: optim.chain(
            optim.scale(0.0), optim.decoupled_weight_decay(0.1, learning_rate=0.0)
        ),
        None,
    ),
]


@pytest.mark.parametrize(("ours", "theirs"), ZERO_LR)
def test_a_zero_learning_rate_is_accepted_and_leaves_the_parameters(ours, theirs):
    params = model_params()
    grads = grad_sequence(params, steps=3)
    got = run_ours(ours(), params, grads)
    assert_same(got, [params] * len(grads), exact=True)
    if theirs is not None:
        assert_same(got, run_torch(theirs, params, grads), exact=True)
