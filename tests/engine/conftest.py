import pytest

import sbfunc


@pytest.fixture
def view0():
    """The event view an algorithm sees, with nothing in it but a key."""
    return sbfunc.Context(sbfunc.random.key(0))


@pytest.fixture
def train0():
    """A train state for an empty algorithm list; ``with_algorithms(train0, algs)`` fills it."""
    return sbfunc.TrainState({}, {}, sbfunc.random.key(0))
