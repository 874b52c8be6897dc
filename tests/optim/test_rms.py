"""scale_by_rms: optax's definition, checked against the updates optax 0.2.8 computes (under
JAX's default float32) for its own transform_test inputs, and optax's test that it is Adam
with ``b1=0`` without the first moment (to its 1e-6: the bias corrections of both in
float64)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sbfunc import optim

SETTINGS = settings(max_examples=25, derandomize=True, database=None, deadline=None)
PARAMS = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([3.0, 4.0])}
GRADS = {"a": torch.tensor([500.0, 5.0]), "b": torch.tensor([300.0, 3.0])}  # optax's setUp

# (eps_in_sqrt, bias_correction, initial_scale) -> three updates of GRADS, as optax computes
# them (decay=0.9, eps=1e-8), "a" then "b" flattened
OPTAX = {
    (True, True, 0.0): [[1.0000001192092896] * 4] * 3,
    (True, True, 0.1): [
        [0.9999983310699463, 0.9824720025062561, 0.9999951124191284, 0.9534626007080078],
        [0.9999993443489075, 0.9915813207626343, 0.9999978542327881, 0.9771254062652588],
        [0.9999997019767761, 0.9946631193161011, 0.9999986886978149, 0.9853824377059937],
    ],
    (True, False, 0.0): [
        [3.1622776985168457, 3.1622776985168457, 3.1622774600982666, 3.1622776985168457],
        [2.2941572666168213] * 4,
        [1.9209468364715576] * 4,
    ],
    (True, False, 0.1): [
        [3.1622719764709473, 3.106848955154419, 3.162261962890625, 3.015113353729248],
        [2.2941553592681885, 2.274843215942383, 2.294152021408081, 2.2416791915893555],
        [1.9209458827972412, 1.9106947183609009, 1.9209439754486084, 1.892866849899292],
    ],
    (False, True, 0.1): [
        [0.9999983310699463, 0.9824719429016113, 0.9999951124191284, 0.9534627199172974],
        [0.9999993443489075, 0.991581380367279, 0.9999978542327881, 0.9771254062652588],
        [0.9999995827674866, 0.9946631789207458, 0.9999986886978149, 0.9853824377059937],
    ],
    (False, False, 0.1): [
        [3.1622719764709473, 3.106848955154419, 3.162261962890625, 3.015113353729248],
        [2.2941555976867676, 2.274843454360962, 2.294152021408081, 2.2416791915893555],
        [1.9209458827972412, 1.9106947183609009, 1.9209442138671875, 1.892867088317871],
    ],
}


@pytest.mark.parametrize(("eps_in_sqrt", "bias_correction", "initial_scale"), sorted(OPTAX))
def test_updates_match_optax(eps_in_sqrt, bias_correction, initial_scale):
    opt = optim.scale_by_rms(
        0.9,
        1e-8,
        initial_scale=initial_scale,
        eps_in_sqrt=eps_in_sqrt,
        bias_correction=bias_correction,
    )
    state = opt.init(PARAMS)
    for expected in OPTAX[eps_in_sqrt, bias_correction, initial_scale]:
        updates, state = opt.update(GRADS, state)
        got = torch.cat([updates["a"], updates["b"]])
        # a few float32 ulps apart: XLA fuses the moving average into an FMA and its rsqrt is
        # approximate
        torch.testing.assert_close(got, torch.tensor(expected), rtol=1e-6, atol=0)
    assert int(state.count) == 3


def test_scalers():
    # optax transform_test.test_scalers('rmsprop'): finite state and updates of the params'
    # shapes
    opt = optim.scale_by_rms()
    state = opt.init(PARAMS)
    updates, state = opt.update(GRADS, state, PARAMS)
    for tree in (updates, state.nu):
        assert all(torch.isfinite(t).all() for t in tree.values())
    assert {k: u.shape for k, u in updates.items()} == {k: p.shape for k, p in PARAMS.items()}


def test_rms_match_adam():
    # optax transform_test.test_rms_match_adam, its inputs and tolerance (rtol=1e-6):
    # scale_by_rms(eps_in_sqrt=False, bias_correction=True) is scale_by_adam(b1=0). (1.1: 7.3e-6
    # apart, the RMS bias correction in float32, Adam's in float64, as torch's; now both in
    # float64.)
    def grad(p):  # of the squared norm
        return {k: 2 * v for k, v in p.items()}

    def run(opt, params):
        state = opt.init(params)
        for _ in range(5):
            updates, state = opt.update(grad(params), state)
            params = optim.apply_updates(params, updates)
        return params

    rms = run(optim.scale_by_rms(decay=0.999, eps_in_sqrt=False, bias_correction=True), PARAMS)
    adam = run(optim.scale_by_adam(b1=0.0), PARAMS)
    torch.testing.assert_close(adam, rms, rtol=1e-6, atol=0)
    # both within 1e-7 of the same steps in float64; optax's own params (JAX's float32, where
    # 1 - 0.999 is 1.3e-5 off) are 7e-6 from them
    exact = run(optim.scale_by_adam(b1=0.0), {k: v.double() for k, v in PARAMS.items()})
    torch.testing.assert_close({k: v.double() for k, v in rms.items()}, exact, rtol=1e-7, atol=0)
    optax = torch.tensor(
        [7.812286853790283, 8.379579544067383, 9.099862098693848, 9.909896850585938]
    )
    torch.testing.assert_close(torch.cat([rms["a"], rms["b"]]), optax, rtol=1e-5, atol=0)


@SETTINGS
@given(
    decay=st.floats(0.0, 0.99),
    scale=st.floats(1e-3, 1e3),
    eps_in_sqrt=st.booleans(),
    bias_correction=st.booleans(),
)
def test_is_scale_invariant_without_eps(decay, scale, eps_in_sqrt, bias_correction):
    # with eps=0 and no initial scale, u / sqrt(EMA(u**2)) does not change when u is scaled
    opt = optim.scale_by_rms(decay, 0.0, eps_in_sqrt=eps_in_sqrt, bias_correction=bias_correction)
    grads = {"w": torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)}
    a, _ = opt.update(grads, opt.init(grads))
    b, _ = opt.update({"w": grads["w"] * scale}, opt.init(grads))
    torch.testing.assert_close(a, b)


def test_state_structure_and_dtype():
    params = {"w": torch.zeros(2, dtype=torch.float64)}
    opt = optim.scale_by_rms(initial_scale=0.5)
    state = opt.init(params)
    assert state.nu["w"].dtype == torch.float64 and torch.equal(
        state.nu["w"], torch.full((2,), 0.5)
    )
    # float32 gradients of float64 parameters: computed in the moments' dtype
    updates, state = opt.update({"w": torch.ones(2)}, state)
    assert updates["w"].dtype == state.nu["w"].dtype == torch.float64


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: optim.scale_by_rms(1.0), ValueError, "decay must be in"),
        (lambda: optim.scale_by_rms(eps=-1.0), ValueError, "eps must be"),
        (lambda: optim.scale_by_rms(initial_scale=-1.0), ValueError, "initial_scale"),
        (lambda: optim.scale_by_rms(eps_in_sqrt=1), TypeError, "eps_in_sqrt"),
        (lambda: optim.scale_by_rms(bias_correction=None), TypeError, "bias_correction"),
        (
            lambda: optim.scale_by_rms().init({"z": torch.zeros(2, dtype=torch.complex64)}),
            TypeError,
            "real parameters",
        ),
    ],
)
def test_invalid_arguments(build, error, match):
    with pytest.raises(error, match=match):
        build()
