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
    a = Plain()
    b = a.renamed("other")
    assert (a.name, b.name, Named().name, Child().name) == ("Plain", "other", "custom", "Child")
    assert repr(b) == "Plain(name='other')" and type(b) is Plain
    with pytest.raises(TypeError, match="name"):
        a.renamed("")


def test_an_algorithm_is_frozen_after_its_constructor():
    class Configured(Plain):
        def __init__(self, rate):
            self.rate = rate  # the constructor may set fields

    alg = Configured(0.5)
    with pytest.raises(AttributeError, match=r"Algorithm 'Configured' is frozen: build a new"):
        alg.rate = 1.0
    with pytest.raises(AttributeError, match="frozen"):
        alg.name = "other"
    with pytest.raises(AttributeError, match="frozen"):
        del alg.rate
    renamed = alg.renamed("other")
    assert (alg.rate, alg.name, renamed.rate, renamed.name) == (0.5, "Configured", 0.5, "other")
    with pytest.raises(AttributeError, match="frozen"):
        renamed.rate = 1.0  # copies are frozen too


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


def test_toy_validates_events_and_reports_exit_code(view0):
    with pytest.raises(TypeError, match="events"):
        Toy(events=["init"])
    toy = Toy(tag=5, exit_code=3)
    state, code = toy.apply(Event.INIT, view0.replace(own=toy.init(view0.key)))
    assert code == 3 and state.own == (5,)


def test_toy_logs_its_tag_in_its_own_state_without_mutating_its_input(view0):
    toy = Toy(tag="t")
    start = view0.replace(own=toy.init(view0.key))
    once = toy.apply(Event.INIT, start)
    twice = toy.apply(Event.INIT, once)
    assert (start.own, once.own, twice.own) == ((), ("t",), ("t", "t"))
    assert twice.key is view0.key and twice.scratch is None


def test_apply_returns_a_new_state_and_leaves_the_view_untouched(view0):
    class Count(Plain):
        def init(self, key):
            return 0

        def apply(self, event, state):
            return state.replace(own=state.own + 1, scratch="seen")

    alg = Count()
    state = view0.replace(own=alg.init(view0.key))
    out = alg.apply(Event.BATCH_END, state)
    assert (out.own, out.scratch) == (1, "seen") and (state.own, state.scratch) == (0, None)
