"""decoupled_sgdw / decoupled_adamw against Composer's DecoupledSGDW / DecoupledAdamW update
rules, written out below per parameter with torch's in-place ops (Composer is not a test
dependency); and the torch-equivalent special cases (no weight decay).

Composer multiplies the parameters by the decay factor, then adds the step in place; ours are
updates that ``apply_updates`` adds, one rounding apart per step (see test_torch_parity): equal
within rtol=1e-5, atol=1e-6 (measured over these 25 steps: DecoupledSGDW at most 2.4e-7 apart,
DecoupledAdamW 3.0e-8)."""

import math

import pytest
import torch

from sbfunc import optim
from tests.optim.helpers import assert_same, grad_sequence, model_params, run_ours, run_torch


def composer_sgdw(
    params,
    grads,
    *,
    lr_at,
    initial_lr,
    momentum=0.0,
    dampening=0.0,
    nesterov=False,
    weight_decay=0.0,
):
    """Composer's DecoupledSGDW step: momentum on the raw gradient, then
    ``p *= 1 - (lr / initial_lr) * weight_decay`` and ``p -= lr * d_p``."""
    p = {k: v.clone() for k, v in params.items()}
    buf: dict = {}
    out = []
    for i, g in enumerate(grads):
        lr = lr_at(i)
        for k in p:
            d_p = g[k]
            if momentum != 0:
                if k not in buf:
                    buf[k] = d_p.clone()
                else:
                    buf[k].mul_(momentum).add_(d_p, alpha=1 - dampening)
                d_p = d_p.add(buf[k], alpha=momentum) if nesterov else buf[k]
            if weight_decay != 0:
                p[k].mul_(1 - (lr / initial_lr) * weight_decay)
            p[k].add_(d_p, alpha=-lr)
        out.append({k: v.clone() for k, v in p.items()})
    return out


def composer_adamw(params, grads, *, lr_at, initial_lr, b1, b2, eps, weight_decay, amsgrad):
    """Composer's DecoupledAdamW step: ``p *= 1 - (lr / initial_lr) * weight_decay``, moments
    by mul + add, then ``p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)``."""
    p = {k: v.clone() for k, v in params.items()}
    m = {k: torch.zeros_like(v) for k, v in p.items()}
    v = {k: torch.zeros_like(x) for k, x in p.items()}
    vmax = {k: torch.zeros_like(x) for k, x in p.items()}
    out = []
    for i, g in enumerate(grads):
        lr, t = lr_at(i), i + 1
        for k in p:
            if weight_decay != 0:
                p[k].mul_(1 - (lr / initial_lr) * weight_decay)
            bc1, bc2 = 1 - b1**t, 1 - b2**t
            m[k].mul_(b1).add_(g[k], alpha=1 - b1)
            v[k].mul_(b2).addcmul_(g[k], g[k], value=1 - b2)
            src = v[k]
            if amsgrad:
                torch.maximum(vmax[k], v[k], out=vmax[k])
                src = vmax[k]
            denom = (src.sqrt() / math.sqrt(bc2)).add_(eps)
            p[k].addcdiv_(m[k], denom, value=-(lr / bc1))
        out.append({k: x.clone() for k, x in p.items()})
    return out


SCHEDULE = optim.warmup_cosine_decay_schedule(0.0, 0.05, 5, 20, end=0.005)


def _lr_at(i):
    return float(SCHEDULE(i))


def _lr(scheduled):
    """The ``lr`` argument and the per-step learning rate of Composer's reference."""
    return (SCHEDULE, _lr_at) if scheduled else (0.05, lambda i: 0.05)


@pytest.mark.parametrize(
    "kw",
    [
        {"weight_decay": 1e-3},
        {"momentum": 0.9, "weight_decay": 1e-2},
        {"momentum": 0.9, "nesterov": True, "weight_decay": 1e-2},
        {"momentum": 0.9, "dampening": 0.4, "weight_decay": 1e-2},
    ],
)
@pytest.mark.parametrize("scheduled", [False, True])
def test_decoupled_sgdw_matches_composer(kw, scheduled):
    params = model_params()
    grads = grad_sequence(params)
    lr, lr_at = _lr(scheduled)
    opt = optim.decoupled_sgdw(lr, initial_lr=0.05, **kw)
    ref = composer_sgdw(params, grads, lr_at=lr_at, initial_lr=0.05, **kw)
    assert_same(run_ours(opt, params, grads), ref, exact=False)


@pytest.mark.parametrize("amsgrad", [False, True])
@pytest.mark.parametrize("scheduled", [False, True])
def test_decoupled_adamw_matches_composer(amsgrad, scheduled):
    params = model_params()
    grads = grad_sequence(params)
    kw = {"b1": 0.9, "b2": 0.95, "eps": 1e-8, "weight_decay": 1e-2, "amsgrad": amsgrad}
    lr, lr_at = _lr(scheduled)
    opt = optim.decoupled_adamw(lr, initial_lr=0.05, **kw)
    ref = composer_adamw(params, grads, lr_at=lr_at, initial_lr=0.05, **kw)
    assert_same(run_ours(opt, params, grads), ref, exact=False)


def test_composer_defaults():
    opt = optim.decoupled_adamw(1e-3)
    assert repr(opt) == (
        "decoupled_adamw(lr=0.001, b1=0.9, b2=0.95, eps=1e-08, weight_decay=1e-05, "
        "amsgrad=False, maximize=False, initial_lr=0.001)"
    )


def test_without_weight_decay_they_are_torch_sgd_and_adam():
    params = model_params()
    grads = grad_sequence(params)
    kw = {"momentum": 0.9, "nesterov": True}
    ref = run_torch(lambda ps: torch.optim.SGD(ps, lr=0.05, **kw), params, grads)
    assert_same(run_ours(optim.decoupled_sgdw(0.05, **kw), params, grads), ref, exact=False)
    ref = run_torch(lambda ps: torch.optim.Adam(ps, lr=0.01), params, grads)
    got = run_ours(optim.decoupled_adamw(0.01, b2=0.999, weight_decay=0.0), params, grads)
    assert_same(got, ref, exact=False)  # Composer's mul + add first moment vs torch's lerp


def test_decay_per_step_is_one_minus_weight_decay_at_the_initial_lr():
    params = {"w": torch.tensor([1.0, -2.0])}
    zero = {"w": torch.zeros(2)}

    def stepped(opt):
        updates, _ = opt.update(zero, opt.init(params), params)
        return optim.apply_updates(params, updates)["w"]

    for opt in (
        optim.decoupled_sgdw(0.3, weight_decay=0.25),
        optim.decoupled_adamw(0.3, weight_decay=0.25),
    ):
        assert torch.equal(stepped(opt), torch.tensor([0.75, -1.5]))
    # half the initial lr: half the decay
    opt = optim.decoupled_sgdw(optim.constant_schedule(0.15), weight_decay=0.25, initial_lr=0.3)
    assert torch.equal(stepped(opt), torch.tensor([0.875, -1.75]))
    # torch's AdamW decays by lr * weight_decay instead
    torch.testing.assert_close(
        stepped(optim.adamw(0.3, weight_decay=0.25)), torch.tensor([0.925, -1.85])
    )


def test_initial_lr_defaults_to_the_schedule_at_step_0_and_refuses_zero():
    opt = optim.decoupled_adamw(optim.cosine_decay_schedule(0.2, 10))
    assert "initial_lr=0.2" in repr(opt)
    with pytest.raises(ValueError, match="initial_lr"):
        optim.decoupled_sgdw(SCHEDULE, weight_decay=1e-3)
    with pytest.raises(ValueError, match="initial_lr"):
        optim.decoupled_adamw(0.1, initial_lr=0.0)
