import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import sbfunc
from sbfunc.algorithms import EMA, SWA, AveragedState

common = settings(max_examples=30, deadline=None, derandomize=True, database=None)
E = sbfunc.Event
values = st.lists(st.floats(-10, 10), min_size=1, max_size=8)


def _feed(alg, sequence, buffers=None):
    state = sbfunc.Context(
        sbfunc.random.key(0),
        params={"w": torch.zeros((), dtype=torch.float64)},
        buffers=buffers or {},
    )
    state = alg.apply(E.INIT, state)
    for v in sequence:
        state = state.replace(params={"w": torch.tensor(v, dtype=torch.float64)})
        state = alg.apply(E.BATCH_END, state)
    return state.own


@common
@given(values, st.floats(0.0, 0.99))
def test_ema_is_the_exponential_average_started_from_a_copy(sequence, smoothing):
    own = _feed(EMA(smoothing=smoothing), sequence)
    expected = sequence[0]
    for v in sequence[1:]:
        expected = smoothing * expected + (1 - smoothing) * v
    assert float(own.params["w"]) == pytest.approx(expected, rel=1e-5, abs=1e-5)
    assert int(own.num_updates) == len(sequence)
    if smoothing == 0.0:  # zero strength: the average is the current value
        assert float(own.params["w"]) == pytest.approx(sequence[-1])


@common
@given(values)
def test_swa_is_the_mean(sequence):
    own = _feed(SWA(0.0, 1.0, "1ba"), sequence)
    assert float(own.params["w"]) == pytest.approx(sum(sequence) / len(sequence), abs=1e-4)


def test_ema_averages_floating_buffers_only():
    buffers = {"mean": torch.zeros(2), "n": torch.zeros((), dtype=torch.int64)}
    own = _feed(EMA(smoothing=0.5), [1.0], buffers)
    assert set(own.buffers) == {"mean"}


@common
@given(st.floats(0.0, 1.0), st.integers(0, 20), st.integers(0, 5), st.integers(1, 4))
def test_update_schedules_are_host_decisions(elapsed, step, epoch, every):
    time = sbfunc.Time(step=step, epoch=epoch, elapsed=elapsed)
    state = sbfunc.Context(sbfunc.random.key(0), time=time)
    ema = EMA(half_life="10ba", ema_start=0.5, update_interval=f"{every}ba")
    assert ema.match(E.BATCH_END, state) == (elapsed >= 0.5 and step % every == 0)
    assert not ema.match(E.EPOCH_END, state) and ema.match(E.INIT, state)
    swa = SWA(0.25, "0.75dur", f"{every}ep")
    in_window = 0.25 <= elapsed < 0.75
    assert swa.match(E.EPOCH_END, state) == (in_window and (epoch + 1) % every == 0)
    assert not swa.match(E.BATCH_END, state)


def test_half_life_sets_the_smoothing():
    assert EMA(half_life="10ba").smoothing == pytest.approx(0.5 ** (1 / 10))
    assert EMA(half_life="4ep", update_interval="2ep").smoothing == pytest.approx(0.5 ** (2 / 4))
    assert EMA().smoothing == pytest.approx(0.5 ** (1 / 1000))


def _fit(algorithms, epochs=2):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1), algorithms)
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))
    g = torch.Generator().manual_seed(0)
    data = [
        (torch.randn(4, 3, generator=g), torch.randint(0, 2, (4,), generator=g)) for _ in range(3)
    ]
    return step, sbfunc.fit(step, state, data, epochs=epochs, progress=False).state


def test_trained_params_never_change_and_the_average_is_readable(tmp_path):
    ema, swa = EMA(smoothing=0.9), SWA(0.0, 0.99, "1ep")
    step, state = _fit([ema, swa])
    _, plain = _fit([])
    assert all(torch.equal(state.params[k], plain.params[k]) for k in plain.params)
    own_ema, own_swa = state.algorithm_state
    assert isinstance(own_ema, AveragedState) and int(own_ema.num_updates) == 6
    # the epochs end at elapsed 0.5 and 1.0 (elapsed counts the finished step, as Composer's
    # timestamp does); 1.0 is past the window's end 0.99
    assert int(own_swa.num_updates) == 1
    params, buffers = ema.averaged(state, step)
    assert params.keys() == state.params.keys() and buffers.keys() == state.buffers.keys()
    assert torch.equal(params["0.weight"], own_ema.params["0.weight"])
    assert torch.equal(buffers["1.num_batches_tracked"], state.buffers["1.num_batches_tracked"])
    assert torch.equal(
        swa.averaged(state, step.algorithms)[1]["1.running_mean"], state.buffers["1.running_mean"]
    )
    path = tmp_path / "ckpt.pt"
    sbfunc.checkpoint.save(state, path)
    fresh = step.init(
        *sbfunc.split_module(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))),
        key=sbfunc.random.key(0),
    )
    loaded = sbfunc.checkpoint.load(path, like=fresh)
    assert torch.equal(loaded.algorithm_state[0].params["0.weight"], own_ema.params["0.weight"])


def test_errors():
    with pytest.raises(ValueError, match="not both"):
        EMA(half_life="10ba", smoothing=0.5)
    with pytest.raises(ValueError, match="smoothing"):
        EMA(smoothing=1.0)
    with pytest.raises(ValueError, match="same unit"):
        EMA(half_life="10ba", update_interval="1ep")
    with pytest.raises(ValueError, match="time string"):
        EMA(half_life="10 steps")
    with pytest.raises(ValueError, match="swa_end must be > swa_start"):
        SWA(0.5, 0.5)
    with pytest.raises(ValueError, match="swa_start"):
        SWA("70%")
    swa = SWA()
    with pytest.raises(ValueError, match="not a top-level algorithm"):
        swa.averaged(sbfunc.TrainState({}, {}, sbfunc.random.key(0)), [])
    with pytest.raises(RuntimeError, match="INIT"):
        swa.apply(E.BATCH_END, sbfunc.Context(sbfunc.random.key(0)))
