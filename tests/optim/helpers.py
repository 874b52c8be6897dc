"""Shared fixtures of the optimizer tests: a small model's parameters, random gradients and
runners of sbfunc's and torch's optimizers over the same gradient sequence."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optree
import torch
from torch import nn

from sbfunc import optim
from tests.helpers import assert_identical

Params = dict[str, torch.Tensor]
STEPS = 25


def model_params(seed: int = 0) -> Params:
    """The parameters of a small MLP with a 1-D and a conv layer (several shapes)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv1d(1, 2, 3), nn.Flatten(), nn.Linear(6, 4), nn.Linear(4, 3))
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def grad_sequence(params: Params, steps: int = STEPS, seed: int = 1) -> list[Params]:
    """Random gradients of mixed scale (one step of tiny ones, one with exact zeros)."""
    gen = torch.Generator().manual_seed(seed)
    seq = []
    for i in range(steps):
        scale = 1e-4 if i == 3 else 3.0 if i == 7 else 1.0
        g = {k: scale * torch.randn(v.shape, generator=gen) for k, v in params.items()}
        if i == 5:
            g = {k: torch.where(v.abs() < 0.5, 0.0, v) for k, v in g.items()}
        seq.append(g)
    return seq


def run_ours(
    opt: optim.GradientTransformation, params: Params, grads: list[Params]
) -> list[Params]:
    """The parameters after each ``opt.update`` and ``apply_updates`` over ``grads``."""
    state = opt.init(params)
    out = []
    for g in grads:
        updates, state = opt.update(g, state, params)
        params = optim.apply_updates(params, updates)
        out.append(params)
    return out


def run_torch(
    make: Callable[[list[torch.Tensor]], torch.optim.Optimizer],
    params: Params,
    grads: list[Params],
    *,
    lr_at: Callable[[int], float] | None = None,
    scheduler: Callable[[torch.optim.Optimizer], Any] | None = None,
) -> list[Params]:
    """The parameters after each ``torch.optim`` step over ``grads``; ``lr_at(i)`` sets the
    learning rate of step ``i`` by hand, ``scheduler`` builds an ``lr_scheduler`` stepped after
    every optimizer step."""
    tensors = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    opt = make(list(tensors.values()))
    sched = scheduler(opt) if scheduler is not None else None
    out = []
    for i, g in enumerate(grads):
        if lr_at is not None:
            for group in opt.param_groups:
                group["lr"] = lr_at(i)
        for k, t in tensors.items():
            t.grad = g[k].clone()
        opt.step()
        if sched is not None:
            sched.step()
        out.append({k: t.detach().clone() for k, t in tensors.items()})
    return out


def assert_same(ours: list[Params], ref: list[Params], *, exact: bool) -> None:
    """Equal at every step: bitwise when ``exact``, else within rtol=1e-5, atol=1e-6 (a
    rounding per step apart, accumulated over ``STEPS``)."""
    assert len(ours) == len(ref)
    for step, (a, b) in enumerate(zip(ours, ref, strict=True)):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
            if exact:
                assert torch.equal(a[k], b[k]), f"step {step}, {k}: not bitwise equal"
            else:
                torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


def as_complex(tree: Params, *, keep: str | None = None) -> Params:
    """complex64 tensors made of a real tree: the real parts are its tensors, the imaginary
    parts the same tensors reversed along their first dimension (negated for 0-d ones);
    ``keep`` names a key left real, so that the tree mixes complex and real parameters."""

    def imaginary(v: torch.Tensor) -> torch.Tensor:
        return v.flip(0) if v.dim() else -v

    return {k: v if k == keep else torch.complex(v, imaginary(v)) for k, v in tree.items()}


def assert_steps_identical(
    opt: optim.GradientTransformation,
    ref: optim.GradientTransformation,
    params: Params,
    grads: list[Params],
    *,
    state_of: Callable[[Any], Any] | None = None,
    ref_state_of: Callable[[Any], Any] = lambda s: s,
) -> None:
    """``opt`` and ``ref`` run side by side over ``grads``: the parameters bit for bit after
    every step, and so ``state_of(opt's state)`` and ``ref_state_of(ref's state)`` when
    ``state_of`` is given."""
    p, s, p_ref, s_ref = params, opt.init(params), params, ref.init(params)
    for g in grads:
        u, s = opt.update(g, s, p)
        u_ref, s_ref = ref.update(g, s_ref, p_ref)
        p, p_ref = optim.apply_updates(p, u), optim.apply_updates(p_ref, u_ref)
        assert_identical(p, p_ref)
        if state_of is not None:
            assert_identical(state_of(s), ref_state_of(s_ref))


def assert_trees_all_close(
    actual: Any, desired: Any, *, rtol: float = 1e-6, atol: float = 0.0
) -> None:
    """optax's ``test_utils.assert_trees_all_close``: the same tree structure (NamedTuple
    types included), every tensor within ``rtol`` and ``atol`` (the dtypes free)."""
    flat_a, spec_a = optree.tree_flatten(actual, none_is_leaf=True)
    flat_d, spec_d = optree.tree_flatten(desired, none_is_leaf=True)
    assert spec_a == spec_d, f"trees have different structures:\n{spec_a}\n{spec_d}"
    for a, d in zip(flat_a, flat_d, strict=True):
        torch.testing.assert_close(a, d, rtol=rtol, atol=atol, check_dtype=False)
