import pytest

import sbfunc
from sbfunc.engine import init_state


@pytest.fixture
def state0():
    return init_state({}, {}, key=sbfunc.random.key(0))
