"""Construction-time validation of the optimizers, their reprs and their input checks."""

import math

import pytest
import torch

from sbfunc import optim


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: optim.sgd(0.0), ValueError, "lr must be a finite float > 0"),
        (lambda: optim.sgd(-1), ValueError, "lr must be"),
        (lambda: optim.sgd(math.nan), ValueError, "lr must be"),
        (lambda: optim.sgd("0.1"), TypeError, "lr must be a float > 0.0 or a schedule"),
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
        opt.update({"w": torch.ones(1)}, (optim.EmptyState(),))


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: optim.scale("2"), TypeError, "step_size"),
        (lambda: optim.scale_by_learning_rate(0.0), ValueError, "learning_rate"),
        (lambda: optim.scale_by_learning_rate(0.1, flip_sign=1), TypeError, "flip_sign"),
        (lambda: optim.add_decayed_weights(-1.0), ValueError, "weight_decay"),
        (lambda: optim.decoupled_weight_decay(0.1, initial_lr=0.0), ValueError, "initial_lr"),
        (lambda: optim.clip_by_global_norm(0.0), ValueError, "max_norm"),
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
