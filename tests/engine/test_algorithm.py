"""Algorithm base class: names, flags, init, abstractness."""

import pytest

from sbfunc.engine import FLAGS, Algorithm, Event
from sbfunc.testing import Toy


class Plain(Algorithm):
    def match(self, event, state):
        return True

    def apply(self, event, state):
        return state


class Named(Plain):
    name = "custom"


class Child(Named):
    pass


def test_name_defaults_to_class_and_is_overridable_per_instance():
    a, b = Plain(), Plain()
    b.name = "other"
    assert (a.name, b.name, Named().name, Child().name) == ("Plain", "other", "custom", "Child")
    assert repr(b) == "Plain(name='other')"


def test_flags_are_declared_false_and_init_has_no_state():
    a = Plain()
    assert all(getattr(a, f) is False for f in FLAGS)
    assert a.init(None) is None and a.parts == ()


def test_abstract_methods_are_required():
    class Half(Algorithm):
        def match(self, event, state):
            return True

    with pytest.raises(TypeError):
        Half()  # type: ignore[abstract]


def test_toy_validates_events_and_reports_exit_code(state0):
    with pytest.raises(TypeError, match="events"):
        Toy(events=["init"])
    out = Toy(exit_code=3).apply(Event.INIT, state0)
    assert isinstance(out, tuple) and out[1] == 3
