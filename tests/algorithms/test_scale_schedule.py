import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc import optim
from sbfunc.algorithms import scale_schedule

common = settings(max_examples=40, deadline=None, derandomize=True, database=None)
ratios = st.sampled_from([0.25, 0.5, 0.8, 1.0, 1.5, 2.0])


@common
@given(st.integers(1, 100), ratios)
def test_durations_scale_like_composer(value, ratio):
    for duration, field in (
        (sbfunc.engine.Duration(epochs=value), "epochs"),
        (sbfunc.engine.Duration(steps=value), "steps"),
    ):
        if int(value * ratio) < 1:
            with pytest.raises(ValueError, match="reduced"):
                scale_schedule(duration, ratio)
            continue
        assert getattr(scale_schedule(duration, ratio), field) == int(value * ratio)
    if int(value * ratio) >= 1:
        assert scale_schedule(value, ratio) == int(value * ratio)


@common
@given(ratios, st.integers(0, 300))
def test_schedules_are_dilated(ratio, t):
    schedules = [
        optim.linear_schedule(1.0, 0.1, 100, transition_begin=10),
        optim.cosine_decay_schedule(1.0, 120, alpha=0.1),
        optim.warmup_cosine_decay_schedule(0.0, 1.0, 20, 200),
        optim.piecewise_constant_schedule(1.0, {50: 0.1, 150: 0.1}),
    ]
    for schedule in schedules:
        scaled = scale_schedule(schedule, ratio)
        value = scaled(t)
        assert value.dtype == torch.float64 and value.dim() == 0
        expected = schedule(torch.tensor(t / ratio, dtype=torch.float64))
        torch.testing.assert_close(value, expected)
        if ratio == 1.0:  # identity at ratio 1
            torch.testing.assert_close(value, schedule(t))


def test_a_shorter_schedule_reaches_its_milestones_sooner():
    lr = scale_schedule(optim.piecewise_constant_schedule(1.0, {100: 0.5}), 0.5)
    assert [float(lr(t)) for t in (49, 50)] == [1.0, 0.5]
    assert "ratio=0.5" in repr(lr)


def test_errors():
    with pytest.raises(ValueError, match="ratio"):
        scale_schedule(sbfunc.engine.Duration(epochs=2), 0.0)
    with pytest.raises(TypeError, match="ratio"):
        scale_schedule(sbfunc.engine.Duration(epochs=2), "half")
    with pytest.raises(TypeError, match="duration_or_schedule"):
        scale_schedule("10ep", 0.5)
    with pytest.raises(ValueError, match="epochs or steps"):
        scale_schedule(sbfunc.engine.Duration(), 0.5)
