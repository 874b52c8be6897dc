"""Schedules: optax's definitions (checked against the formulas in plain Python math), ranges,
endpoints, monotonicity, boundaries, and int / tensor counts."""

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sbfunc import optim

SETTINGS = settings(max_examples=30, derandomize=True, database=None, deadline=None)
values = st.floats(-10, 10, allow_nan=False).map(lambda x: round(x, 3))
positive = st.floats(1e-4, 10).map(lambda x: round(x, 4) or 1e-4)
steps = st.integers(1, 40)


def curve(schedule, n):
    return [schedule(t).item() for t in range(n)]


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)


def non_increasing(xs):
    return all(b <= a for a, b in itertools.pairwise(xs))


@SETTINGS
@given(values, values, steps, st.integers(0, 10))
def test_linear_schedule(init, end, transition, begin):
    s = optim.linear_schedule(init, end, transition, transition_begin=begin)
    xs = curve(s, begin + transition + 5)
    for t, x in enumerate(xs):  # optax's polynomial_schedule with power 1
        frac = 1 - min(max(t - begin, 0), transition) / transition
        assert close(x, (init - end) * frac + end)
    assert all(close(x, init) for x in xs[: begin + 1])
    assert all(x == end for x in xs[begin + transition :])
    assert non_increasing(xs if init >= end else [-x for x in xs])
    lo, hi = min(init, end), max(init, end)
    assert all(lo - 1e-12 <= x <= hi + 1e-12 for x in xs)


def test_linear_schedule_without_transition_is_constant():
    assert curve(optim.linear_schedule(0.3, 1.0, 0), 3) == [0.3, 0.3, 0.3]


@SETTINGS
@given(positive, steps, st.floats(0, 1), st.sampled_from([1.0, 2.0]))
def test_cosine_decay_schedule(init, decay_steps, alpha, exponent):
    s = optim.cosine_decay_schedule(init, decay_steps, alpha=alpha, exponent=exponent)
    xs = curve(s, decay_steps + 4)
    for t, x in enumerate(xs):
        cos = 0.5 * (1 + math.cos(math.pi * min(t, decay_steps) / decay_steps))
        assert close(x, init * ((1 - alpha) * cos**exponent + alpha))
    assert close(xs[0], init)
    assert all(close(x, alpha * init) for x in xs[decay_steps:])
    assert non_increasing(xs)
    assert all(alpha * init - 1e-12 <= x <= init + 1e-12 for x in xs)


@SETTINGS
@given(st.floats(0, 1), positive, st.integers(0, 10), steps, st.floats(0, 1))
def test_warmup_cosine_decay_schedule(init, peak, warmup, decay, end_frac):
    init, end, total = init * peak, end_frac * peak, warmup + decay
    s = optim.warmup_cosine_decay_schedule(init, peak, warmup, total, end=end)
    xs = curve(s, total + 3)
    if warmup:
        assert close(xs[0], init)
    assert close(xs[warmup], peak)
    assert all(close(x, end) for x in xs[total:])
    assert non_increasing([-x for x in xs[: warmup + 1]])  # warm-up rises
    assert non_increasing(xs[warmup:])  # then decays


@SETTINGS
@given(positive, st.integers(1, 5), st.floats(0.1, 2.0), st.integers(0, 4), st.booleans())
def test_exponential_decay(init, transition, rate, begin, staircase):
    s = optim.exponential_decay(
        init, transition, rate, transition_begin=begin, staircase=staircase
    )
    xs = curve(s, begin + 4 * transition + 2)
    for t, x in enumerate(xs):
        p = (t - begin) / transition
        p = math.floor(p) if staircase else p
        assert math.isclose(x, init if t <= begin else init * rate**p, rel_tol=1e-12)
    assert non_increasing(xs if rate <= 1 else [-x for x in xs])
    if staircase:  # constant within each interval
        for k in range(4):
            first = begin + k * transition
            assert len(set(xs[first : first + transition])) == 1


def test_exponential_decay_end_bounds_the_value():
    assert curve(optim.exponential_decay(1.0, 1, 0.5, end=0.2), 5) == [1.0, 0.5, 0.25, 0.2, 0.2]
    assert curve(optim.exponential_decay(1.0, 1, 2.0, end=3.0), 4) == [1.0, 2.0, 3.0, 3.0]


@SETTINGS
@given(values, st.dictionaries(st.integers(0, 20), st.floats(0, 3), max_size=4))
def test_piecewise_constant_schedule(init, boundaries_and_scales):
    s = optim.piecewise_constant_schedule(init, boundaries_and_scales)
    for t, x in enumerate(curve(s, 24)):
        expected = init
        for b, scale in sorted(boundaries_and_scales.items()):
            if t >= b:  # a boundary applies from its own step on
                expected *= scale
        assert x == expected


@SETTINGS
@given(st.lists(st.integers(0, 10), min_size=1, max_size=3), st.data())
def test_join_schedules_switches_at_each_boundary(gaps, data):
    bounds = [sum(gaps[: i + 1]) for i in range(len(gaps))]
    inits = data.draw(st.lists(values, min_size=len(bounds) + 1, max_size=len(bounds) + 1))
    parts = [optim.linear_schedule(v, v + 1.0, 7) for v in inits]
    s = optim.join_schedules(parts, bounds)
    for t in range(bounds[-1] + 9):
        i = sum(t >= b for b in bounds)  # the active schedule
        start = 0 if i == 0 else bounds[i - 1]
        assert s(t).item() == parts[i](t - start).item()


def test_join_accepts_user_functions():
    s = optim.join_schedules([lambda c: 1.0, lambda c: c * 0.5], [2])
    assert curve(s, 5) == [1.0, 1.0, 0.0, 0.5, 1.0]


@pytest.mark.parametrize(
    "schedule",
    [
        optim.constant_schedule(0.5),
        optim.linear_schedule(1.0, 0.0, 10, transition_begin=2),
        optim.cosine_decay_schedule(1.0, 10),
        optim.warmup_cosine_decay_schedule(0.0, 1.0, 3, 10),
        optim.exponential_decay(1.0, 3, 0.5, staircase=True),
        optim.piecewise_constant_schedule(1.0, {3: 0.1}),
    ],
)
def test_int_and_tensor_counts_agree_and_give_0d_float64(schedule):
    for t in range(12):
        a, b = schedule(t), schedule(torch.tensor(t))
        assert a.shape == () and a.dtype == torch.float64 and torch.equal(a, b)


def test_reprs():
    assert repr(optim.cosine_decay_schedule(0.1, 100)) == (
        "cosine_decay_schedule(init=0.1, decay_steps=100, alpha=0.0, exponent=1.0)"
    )
    assert repr(optim.piecewise_constant_schedule(1, {5: 0.1, 2: 0.5})) == (
        "piecewise_constant_schedule(init=1.0, boundaries_and_scales={2: 0.5, 5: 0.1})"
    )
    joined = optim.join_schedules([optim.constant_schedule(1.0)] * 2, [3])
    assert repr(joined) == (
        "join_schedules(schedules=[constant_schedule(value=1.0), constant_schedule(value=1.0)], "
        "boundaries=[3])"
    )


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: optim.constant_schedule("a"), TypeError, "value must be a finite float"),
        (lambda: optim.constant_schedule(math.inf), ValueError, "value must be a finite"),
        (lambda: optim.linear_schedule(1, 0, 2.5), TypeError, "transition_steps must be an int"),
        (
            lambda: optim.linear_schedule(1, 0, 5, transition_begin=-1),
            ValueError,
            "transition_begin",
        ),
        (lambda: optim.cosine_decay_schedule(1, 0), ValueError, "decay_steps must be an int >= 1"),
        (lambda: optim.warmup_cosine_decay_schedule(0, 1, 5, 5), ValueError, "decay_steps"),
        (lambda: optim.warmup_cosine_decay_schedule(0, 1, -1, 5), ValueError, "warmup_steps"),
        (lambda: optim.exponential_decay(1, 0, 0.5), ValueError, "transition_steps"),
        (lambda: optim.exponential_decay(1, 1, 0.0), ValueError, "decay_rate"),
        (lambda: optim.exponential_decay(1, 1, 0.5, staircase=1), TypeError, "staircase"),
        (
            lambda: optim.piecewise_constant_schedule(1, {2: -0.1}),
            ValueError,
            "scale at boundary 2",
        ),
        (lambda: optim.piecewise_constant_schedule(1, {2.5: 0.1}), TypeError, "boundary"),
        (lambda: optim.piecewise_constant_schedule(1, [0.1]), TypeError, "mapping"),
        (lambda: optim.join_schedules([], []), ValueError, "at least one"),
        (lambda: optim.join_schedules([abs, abs], []), ValueError, "len\\(schedules\\) - 1"),
        (lambda: optim.join_schedules([abs, abs, abs], [3, 1]), ValueError, "non-decreasing"),
        (lambda: optim.join_schedules([abs, 1.0], [1]), TypeError, "callables"),
        (lambda: optim.constant_schedule(1.0)(1.5), TypeError, "count must be an int"),
        (lambda: optim.constant_schedule(1.0)(torch.ones(2)), ValueError, "0-d"),
    ],
)
def test_invalid_arguments(build, error, match):
    with pytest.raises(error, match=match):
        build()
