"""The names 1.0 renamed keep working for one release: each warns, naming the new name, and
gives the same object (the CHANGELOG's migration table)."""

import importlib
import warnings

import pytest
import torch

import sbfunc
from sbfunc.engine import Algorithm, Event

RENAMED = [
    ("sbfunc", "State", "sbfunc", "Context"),
    ("sbfunc", "chain", "sbfunc", "sequence"),
    ("sbfunc", "named_chain", "sbfunc", "named_sequence"),
    ("sbfunc", "inject_hyperparams", "sbfunc", "schedule_hyperparams"),
    ("sbfunc.engine", "State", "sbfunc.engine", "Context"),
    ("sbfunc.engine", "Schedule", "sbfunc.engine", "ElapsedSchedule"),
    ("sbfunc.engine", "chain", "sbfunc.engine", "sequence"),
    ("sbfunc.engine", "named_chain", "sbfunc.engine", "named_sequence"),
    ("sbfunc.engine", "inject_hyperparams", "sbfunc.engine", "schedule_hyperparams"),
]


@pytest.mark.parametrize(("owner", "old", "home", "new"), RENAMED)
def test_a_renamed_name_warns_and_gives_the_new_one(owner, old, home, new):
    module = importlib.import_module(owner)
    message = f"{owner}.{old} was renamed to {home}.{new}; the alias will be removed in 1.1"
    with pytest.warns(DeprecationWarning, match=message.replace(".", r"\.")) as caught:
        got = getattr(module, old)
    assert got is getattr(importlib.import_module(home), new)
    assert caught[0].filename == __file__  # the warning points at the caller
    assert old not in dir(module) and old not in module.__all__


def _step() -> tuple[sbfunc.step.TrainStep, sbfunc.TrainState]:
    model = torch.nn.Linear(2, 2)
    loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy)
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1))
    return step, step.init(*sbfunc.split_module(model), key=sbfunc.random.key(0))


def test_step_fire_is_run_event_with_a_warning():
    step, state = _step()
    with pytest.warns(DeprecationWarning, match="TrainStep.fire was renamed to"):
        fired = step.fire(Event.EPOCH_END, state)
    assert fired == step.run_event(Event.EPOCH_END, state) == (state, ())


def test_a_subclass_that_defines_bind_warns_and_is_prepared_through_it():
    with pytest.warns(DeprecationWarning, match="Algorithm.bind was renamed to"):

        class Old(Algorithm):
            def match(self, event, state):
                return False

            def apply(self, event, state):
                return state

            def bind(self, *, loss_fn, per_sample):
                return self.renamed("bound")

    assert Old().for_step(loss_fn=None, per_sample=None).name == "bound"


def test_the_new_names_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sbfunc.sequence is sbfunc.engine.sequence
        assert sbfunc.Context is sbfunc.engine.Context
        step, state = _step()
        step.run_event(Event.EPOCH_END, state)
