"""sbfunc.validation: one convention (TypeError for a wrong type, ValueError for a value out of
range, NaN out of every range), and every public fraction/int argument follows it."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import sbfunc
from sbfunc import policies
from sbfunc import random as sbrandom
from sbfunc.validation import (
    check_bool,
    check_callable,
    check_choice,
    check_fraction,
    check_int,
    check_real,
    check_tensor,
    describe,
    interval,
)

SETTINGS = settings(max_examples=60, derandomize=True, database=None, deadline=None)

_MODEL = nn.Linear(4, 3)
_ALG = sbfunc.algorithms.LabelSmoothing(0.1, num_classes=3)
NAN = float("nan")

# Every public function or constructor with a fraction argument, called with that argument.
FRACTIONS = {
    "check_keep": sbfunc.select._base.check_keep,
    "rank_power.keep": policies.rank_power,
    "top_k.keep": policies.top_k,
    "random_subset.keep": policies.random_subset,
    "grad_norm_importance.keep": policies.grad_norm_importance,
    "grad_norm_importance.smoothing": lambda v: policies.grad_norm_importance(0.5, smoothing=v),
    "jiang_cdf.sampling_min": lambda v: policies.jiang_cdf(1.0, sampling_min=v),
    "infobatch.prune_ratio": lambda v: policies.infobatch(v, 0.9, num_ids=4),
    "infobatch.delta": lambda v: policies.infobatch(0.5, v, num_ids=4),
    "loshchilov.keep": lambda v: policies.loshchilov(10.0, v, num_ids=4),
    "SelectiveBackprop.start": lambda v: sbfunc.SelectiveBackprop(v, 1.0),
    "SelectiveBackprop.keep": lambda v: sbfunc.SelectiveBackprop(keep=v),
    "should_selective_backprop.current_duration": lambda v: (
        sbfunc.selective_backprop.should_selective_backprop(v, 0)
    ),
    "select_using_loss.keep": lambda v: sbfunc.compat.select_using_loss(
        torch.zeros(4, 4), torch.zeros(4, dtype=torch.int64), _MODEL, F.cross_entropy, keep=v
    ),
    "during.start": lambda v: sbfunc.during(_ALG, v, 1.0),
    "CutOut.length": lambda v: sbfunc.algorithms.CutOut(length=v),
    "LabelSmoothing.smoothing": lambda v: sbfunc.algorithms.LabelSmoothing(v, num_classes=3),
    "random.bernoulli.p": lambda v: sbrandom.bernoulli(sbrandom.key(0), v, (2,)),
}

# Every public function or constructor with an int argument (>= 1 here), called with it.
INTS = {
    "jiang_cdf.history": lambda v: policies.jiang_cdf(1.0, history=v),
    "stale_sb.num_ids": lambda v: policies.stale_sb(1.0, num_ids=v),
    "infobatch.num_ids": lambda v: policies.infobatch(0.5, 0.9, num_ids=v),
    "loshchilov.num_ids": lambda v: policies.loshchilov(10.0, 0.5, num_ids=v),
    "every_n_steps.n": lambda v: sbfunc.every_n_steps(_ALG, v),
    "CutOut.num_holes": lambda v: sbfunc.algorithms.CutOut(num_holes=v),
    "LabelSmoothing.num_classes": lambda v: sbfunc.algorithms.LabelSmoothing(0.1, num_classes=v),
    "tau_threshold.batch": lambda v: policies.tau_threshold(8, v),
}

BAD_FRACTIONS = [(NAN, ValueError), (True, TypeError), ("0.5", TypeError), (-1, ValueError)]
BAD_FRACTIONS += [(2, ValueError), (math.inf, ValueError), (torch.tensor(0.5), TypeError)]
BAD_INTS = [(NAN, TypeError), (True, TypeError), ("1", TypeError), (-1, ValueError)]
BAD_INTS += [(0, ValueError), (2.0, TypeError), (torch.tensor(2), TypeError)]


@pytest.mark.parametrize("name", sorted(FRACTIONS))
@pytest.mark.parametrize(("value", "error"), BAD_FRACTIONS, ids=repr)
def test_every_fraction_argument_raises_the_same_exception_for_the_same_mistake(
    name, value, error
):
    if name == "random.bernoulli.p" and isinstance(value, torch.Tensor):
        pytest.skip("bernoulli takes a tensor of probabilities too")
    with pytest.raises(error) as info:
        FRACTIONS[name](value)
    assert type(info.value) is error  # not a subclass of another kind either


@pytest.mark.parametrize("name", sorted(INTS))
@pytest.mark.parametrize(("value", "error"), BAD_INTS, ids=repr)
def test_every_int_argument_raises_the_same_exception_for_the_same_mistake(name, value, error):
    with pytest.raises(error):
        INTS[name](value)


@pytest.mark.parametrize("name", sorted(FRACTIONS))
def test_fraction_messages_name_the_argument_and_the_value(name):
    argument = name.rsplit(".", 1)[-1]
    argument = {"check_keep": "keep", "check_fraction": "x"}.get(argument, argument)
    with pytest.raises(ValueError) as info:
        FRACTIONS[name](NAN)
    assert argument in str(info.value) and "nan" in str(info.value)


finite = st.floats(-10, 10, allow_nan=False)


@SETTINGS
@given(value=st.one_of(finite, st.integers(-10, 10)), low=finite, high=finite)
def test_check_real_accepts_exactly_the_closed_interval(value, low, high):
    inside = low <= value <= high
    if inside:
        assert check_real(value, "x", low=low, high=high) == float(value)
    else:
        with pytest.raises(ValueError, match=r"^x must be .*, got "):
            check_real(value, "x", low=low, high=high)


@SETTINGS
@given(value=st.floats(0, 1), open_low=st.booleans(), open_high=st.booleans())
def test_check_fraction_open_ends(value, open_low, open_high):
    ok = (value > 0 if open_low else True) and (value < 1 if open_high else True)
    if ok:
        assert check_fraction(value, "f", open_low=open_low, open_high=open_high) == value
    else:
        with pytest.raises(ValueError, match=r"f must be in [\[(]0, 1[\])], got"):
            check_fraction(value, "f", open_low=open_low, open_high=open_high)


@SETTINGS
@given(value=st.one_of(st.booleans(), st.text(max_size=3), st.none(), st.lists(st.integers())))
def test_non_numbers_are_type_errors(value):
    with pytest.raises(TypeError, match=r"^x must be"):
        check_real(value, "x")
    with pytest.raises(TypeError, match=r"^x must be"):
        check_fraction(value, "x")
    with pytest.raises(TypeError, match=r"^x must be an int"):
        check_int(value, "x")


@SETTINGS
@given(value=st.integers(-100, 100), low=st.integers(-5, 5))
def test_check_int_low_bound(value, low):
    if value >= low:
        assert check_int(value, "n", low=low) == value
    else:
        with pytest.raises(ValueError, match=f"n must be an int >= {low}, got {value}"):
            check_int(value, "n", low=low)


def test_messages_follow_one_pattern_with_the_fix():
    with pytest.raises(ValueError) as info:
        check_fraction(2.0, "keep", open_low=True, fix="e.g. keep=0.5")
    assert str(info.value) == "keep must be in (0, 1], got 2.0; e.g. keep=0.5"
    with pytest.raises(TypeError) as info:
        check_int(2.0, "n", low=1)
    assert str(info.value) == "n must be an int >= 1, got 2.0; pass the int 2"
    with pytest.raises(TypeError, match=r"got '0.5' \(a str\); pass the number, not its text"):
        check_real("0.5", "lr")


def test_bool_choice_callable_and_tensor_checks():
    assert check_bool(False, "flag") is False
    with pytest.raises(TypeError, match="flag must be True or False, got 0"):
        check_bool(0, "flag")
    assert check_choice("skip", "mode", ("skip", "raise")) == "skip"
    with pytest.raises(ValueError, match="mode must be one of 'raise', 'skip', got 'x'"):
        check_choice("x", "mode", ("skip", "raise"))
    with pytest.raises(ValueError, match="mode must be one of"):
        check_choice([], "mode", {"skip"})  # unhashable: still a ValueError
    assert check_callable(len, "fn") is len
    with pytest.raises(TypeError, match="fn must be callable, got 3"):
        check_callable(3, "fn")
    t = torch.zeros(3)
    assert check_tensor(t, "s", dim=1, size=3, floating=True) is t
    with pytest.raises(ValueError, match="s must be a 1-D tensor with 4 rows"):
        check_tensor(t, "s", dim=1, size=4)
    with pytest.raises(TypeError, match="s must be an integer tensor"):
        check_tensor(t, "s", floating=False)
    with pytest.raises(TypeError, match=r"s must be a torch\.int64 tensor"):
        check_tensor(t, "s", dtype=torch.int64)
    with pytest.raises(TypeError, match=r"s must be a floating tensor, got \[1.0\] \(a list\)"):
        check_tensor([1.0], "s", floating=True)


def test_describe_and_interval():
    assert describe(None) == "None" and describe(1.5) == "1.5"
    assert describe("x" * 100).endswith("... (a str)")
    assert interval() == "" and interval(high=1, open_high=True) == "< 1"
    assert interval(0.5, 2.5) == "in [0.5, 2.5]"
