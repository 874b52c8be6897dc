"""Eager results bit for bit with sbfunc 1.0.0 (see ``tests/golden_configs.py``)."""

import json

import pytest

from tests.golden_configs import GOLDEN, configs, digest

EXPECTED = json.loads(GOLDEN.read_text())


def test_every_configuration_has_a_golden_value():
    assert set(EXPECTED) == set(configs())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_eager_steps_match_sbfunc_1_0_bit_for_bit(name):
    assert digest(name) == EXPECTED[name]
