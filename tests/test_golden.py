"""Eager results bit for bit with sbfunc 1.0.0 (see ``tests/golden_configs.py``), except the
configurations whose random draws changed on purpose in 1.1: those are pinned to the value
1.1.0 wrote (``tests/data/golden_1_1_0.json``), and ``CHANGED_IN_1_1`` says why (the CHANGELOG
lists them)."""

import json

import pytest

from tests.golden_configs import GOLDEN, GOLDEN_1_1, configs, digest

EXPECTED = json.loads(GOLDEN.read_text())
EXPECTED_1_1 = json.loads(GOLDEN_1_1.read_text())
CHANGED_IN_1_1 = {
    "sb_bayesian": (
        "issue 37: bayesian() draws its Monte-Carlo noise once per step, normal(key, (draws, "
        "C)) shared by every row (common random numbers), where 1.0 drew (N, draws, C)"
    ),
}


def test_every_configuration_has_a_golden_value():
    assert set(EXPECTED) == set(configs())
    assert set(EXPECTED_1_1) == set(CHANGED_IN_1_1)


@pytest.mark.parametrize("name", sorted(set(EXPECTED) - set(CHANGED_IN_1_1)))
def test_eager_steps_match_sbfunc_1_0_bit_for_bit(name):
    assert digest(name) == EXPECTED[name]


@pytest.mark.parametrize("name", sorted(CHANGED_IN_1_1))
def test_configurations_whose_draws_changed_match_sbfunc_1_1_bit_for_bit(name):
    assert EXPECTED_1_1[name] != EXPECTED[name], CHANGED_IN_1_1[name]
    assert digest(name) == EXPECTED_1_1[name]
