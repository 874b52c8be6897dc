"""sbfunc.optim against torch.optim over 25 steps of random gradients on a small model.

The updates are deltas that ``apply_updates`` adds, so the parameters are bitwise equal wherever
torch's last operation is such an add: Adam (every flag, float or scheduled learning rate: its
``addcdiv_`` divides, then adds). Where torch fuses the parameter into its last kernel, one
rounding differs: SGD's ``p.add_(g, alpha=-lr)`` (a fused multiply-add; ours multiplies, then
adds, as torch's own compiled path does) and AdamW's ``p.mul_(1 - lr * wd)`` before the Adam
step; those are equal within rtol=1e-5, atol=1e-6 (measured over these 25 steps: SGD at most
4.8e-7 apart, AdamW 9.3e-10 with 0.2% of the entries 1 ulp apart). SGD's momentum buffers, which
torch keeps apart from the parameters, are bitwise equal. Complex parameters run, as in torch,
on their real views: Adam's parameters bitwise equal to torch's for-loop path (its CPU default)
and to its foreach path, except with an L2 weight decay and no ``maximize``, where torch's two
paths differ from each other by one rounding (foreach adds the decay on real views, the loop on
the complex tensors, as ours).
"""

import pytest
import torch

from sbfunc import optim
from tests.optim.helpers import (
    as_complex,
    assert_same,
    grad_sequence,
    model_params,
    run_ours,
    run_torch,
)

SGD_CASES = [
    {},
    {"momentum": 0.9},
    {"momentum": 0.9, "dampening": 0.3},
    {"momentum": 0.9, "nesterov": True},
    {"weight_decay": 0.05},
    {"maximize": True},
    {"momentum": 0.8, "nesterov": True, "weight_decay": 0.05, "maximize": True},
    {"momentum": 0.5, "dampening": 0.5, "weight_decay": 0.1, "maximize": True},
]
ADAM_CASES = [
    {},
    {"amsgrad": True},
    {"maximize": True},
    {"weight_decay": 0.1},
    {"b1": 0.0, "b2": 0.5, "eps": 1e-3},
    {"weight_decay": 0.1, "amsgrad": True, "maximize": True},
]
FOREACH = [None, True]  # torch's default (the for-loop on CPU) and its foreach path


@pytest.mark.parametrize("foreach", FOREACH)
@pytest.mark.parametrize("kw", SGD_CASES)
def test_sgd_matches_torch(kw, foreach):
    params = model_params()
    grads = grad_sequence(params)
    ours = run_ours(optim.sgd(0.05, **kw), params, grads)
    ref = run_torch(lambda ps: torch.optim.SGD(ps, lr=0.05, foreach=foreach, **kw), params, grads)
    assert_same(ours, ref, exact=False)  # torch fuses p + (-lr) * g (see the module docs)


@pytest.mark.parametrize("kw", [k for k in SGD_CASES if k.get("momentum")])
def test_sgd_momentum_buffers_match_torch_bitwise(kw):
    params = model_params()
    grads = grad_sequence(params)
    kw = {k: v for k, v in kw.items() if k != "weight_decay"}  # (the decay reads p)
    opt = optim.sgd(0.05, **kw)
    state = opt.init(params)
    tensors = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    ref = torch.optim.SGD(list(tensors.values()), lr=0.05, **kw)
    for g in grads:
        updates, state = opt.update(g, state, params)
        params = optim.apply_updates(params, updates)
        for k, t in tensors.items():
            t.grad = g[k].clone()
        ref.step()
    (trace,) = [s for s in state if isinstance(s, optim.TraceState)]
    for k, t in tensors.items():
        assert torch.equal(trace.momentum_buffer[k], ref.state[t]["momentum_buffer"]), k


def _torch_adam_kwargs(kw):
    out = {k: v for k, v in kw.items() if k not in ("b1", "b2")}
    if "b1" in kw:
        out["betas"] = (kw["b1"], kw["b2"])
    return out


@pytest.mark.parametrize("foreach", FOREACH)
@pytest.mark.parametrize("kw", ADAM_CASES)
@pytest.mark.parametrize(
    ("ours", "theirs"), [(optim.adam, torch.optim.Adam), (optim.adamw, torch.optim.AdamW)]
)
def test_adam_and_adamw_match_torch_bitwise(ours, theirs, kw, foreach):
    params = model_params()
    grads = grad_sequence(params)
    tkw = _torch_adam_kwargs(kw)
    got = run_ours(ours(0.01, **kw), params, grads)
    ref = run_torch(lambda ps: theirs(ps, lr=0.01, foreach=foreach, **tkw), params, grads)
    assert_same(got, ref, exact=ours is optim.adam)  # AdamW: p * (1 - lr * wd) first


@pytest.mark.parametrize("foreach", FOREACH)
@pytest.mark.parametrize("kw", ADAM_CASES)
@pytest.mark.parametrize(
    ("ours", "theirs"), [(optim.adam, torch.optim.Adam), (optim.adamw, torch.optim.AdamW)]
)
def test_adam_and_adamw_match_torch_on_complex_parameters(ours, theirs, kw, foreach):
    # complex64 parameters and a real one in one dict; AMSGrad (no complex maximum kernel)
    # runs on the real views too
    params = as_complex(model_params(), keep="3.bias")
    grads = [as_complex(g, keep="3.bias") for g in grad_sequence(model_params())]
    tkw = _torch_adam_kwargs(kw)
    got = run_ours(ours(0.01, **kw), params, grads)
    ref = run_torch(lambda ps: theirs(ps, lr=0.01, foreach=foreach, **tkw), params, grads)
    torch_paths_differ = foreach and kw.get("weight_decay") and not kw.get("maximize")
    assert_same(got, ref, exact=ours is optim.adam and not torch_paths_differ)


def test_defaults_match_torch_defaults():
    # (AdamW's default weight decay is 0.01: within one rounding, as above)
    params = model_params()
    grads = grad_sequence(params)
    for ours, theirs in [(optim.adam, torch.optim.Adam), (optim.adamw, torch.optim.AdamW)]:
        got, ref = run_ours(ours(1e-3), params, grads), run_torch(theirs, params, grads)
        assert_same(got, ref, exact=ours is optim.adam)


SCHEDULE = optim.warmup_cosine_decay_schedule(0.0, 0.05, 5, 20, end=0.005)


def _lr_at(i):
    return float(SCHEDULE(i))


@pytest.mark.parametrize(
    ("ours", "theirs", "kw"),
    [
        (optim.adam, torch.optim.Adam, {"weight_decay": 0.1, "amsgrad": True}),
        (optim.adamw, torch.optim.AdamW, {"weight_decay": 0.1}),
        (optim.sgd, torch.optim.SGD, {"momentum": 0.9, "weight_decay": 0.05}),
        (optim.sgd, torch.optim.SGD, {"momentum": 0.9, "dampening": 0.2, "maximize": True}),
    ],
)
def test_scheduled_lr_matches_torch_with_per_step_lr(ours, theirs, kw):
    params = model_params()
    grads = grad_sequence(params)
    got = run_ours(ours(SCHEDULE, **kw), params, grads)
    ref = run_torch(lambda ps: theirs(ps, lr=0.05, **kw), params, grads, lr_at=_lr_at)
    assert_same(got, ref, exact=ours is optim.adam)


@pytest.mark.parametrize(
    ("ours", "theirs"), [(optim.adamw, torch.optim.AdamW), (optim.sgd, torch.optim.SGD)]
)
def test_schedule_matches_lambda_lr(ours, theirs):
    base = 0.05
    params = model_params()
    grads = grad_sequence(params)
    got = run_ours(ours(SCHEDULE), params, grads)
    ref = run_torch(
        lambda ps: theirs(ps, lr=base),
        params,
        grads,
        scheduler=lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda i: _lr_at(i) / base),
    )
    assert_same(got, ref, exact=False)


def test_user_schedules_returning_floats_or_float32_tensors():
    params = model_params()
    grads = grad_sequence(params, steps=6)
    ref = run_ours(optim.adam(SCHEDULE), params, grads)
    as_float = run_ours(optim.adam(lambda c: _lr_at(int(c))), params, grads)
    assert_same(as_float, ref, exact=True)  # the same float64 values
    as_f32 = run_ours(optim.adam(lambda c: SCHEDULE(c).float()), params, grads)
    assert_same(as_f32, ref, exact=False)  # the lr rounded to float32 first
