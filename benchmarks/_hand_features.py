"""Hand-written pure steps with sbfunc's safety features: the fair limit of a compiled step.

:func:`_steps.hand_runner` is the bare limit (no guard, no tie-breaking). A step of sbfunc's
also guards against non-finite values and breaks selection ties from its key, so the limit it
is held to here does the same work, written as directly as a person would write it:

* **the guard** (``nonfinite="skip"``): rows whose inputs are not finite are replaced by a copy
  of a usable row and given no weight; rows whose loss is not finite are left out of the mean;
  an update whose loss or gradients are not finite never reaches the state (decided on the
  host after the step, which on a CPU reads the flag for free; on an accelerator a
  ``torch.where`` in the graph); skipped updates and left-out rows are counted;
* **Selective Backprop's selection** (``select=True``): a no-grad scoring forward, non-finite
  scores ranked lowest with weight 0, ties broken by keyed noise (one packed ``argsort``),
  Composer's rank-power law drawn by Gumbel-top-k from an :mod:`sbfunc.random` key, and the
  unscorable rows left out counted.

Imported by ``compiled_limit.py`` (after it sets ``OMP_WAIT_POLICY``); it uses only
``sbfunc.random``, so it runs against sbfunc 1.0 as well.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from _steps import KEEP, LR, Batch, _own
from torch import nn

import sbfunc

B1, B2, EPS = 0.9, 0.999, 1e-8
Dicts = dict[str, torch.Tensor]


class GuardedState(NamedTuple):
    params: Dicts
    mu: Dicts
    nu: Dicts
    count: torch.Tensor  # 0-d int64: updates applied (Adam's step)
    steps: torch.Tensor  # 0-d int64: steps run (the key's counter)
    key: torch.Tensor
    skipped: torch.Tensor  # 0-d int64: updates skipped
    rows_bad: torch.Tensor  # 0-d int64: rows left out (non-finite input, loss or score)


def finite_rows(x: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(x).flatten(1).all(1)


def substitute(x: torch.Tensor, y: torch.Tensor, ok: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Every row where ``ok`` is false replaced by the first row where it holds."""
    n = ok.shape[0]
    source = torch.where(ok, torch.arange(n), ok.to(torch.int8).argmax())
    return x.index_select(0, source), y.index_select(0, source)


def rank_power_rows(losses: torch.Tensor, key: torch.Tensor, k: int) -> torch.Tensor:
    """``k`` sorted rows drawn by Composer's rank-power law; ties broken by keyed noise,
    non-finite scores ranked lowest with weight 0."""
    n = losses.shape[0]
    tie_key, draw_key = sbfunc.random.split(key)
    tie = sbfunc.random.bits(tie_key, (n,))
    gumbel = sbfunc.random.gumbel_from_uniform(sbfunc.random.uniform(draw_key, (n,)))
    finite = torch.isfinite(losses)
    lowest = torch.where(finite, losses, -torch.inf).to(torch.float32) + 0.0
    bits = lowest.view(torch.int32)
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(torch.int64)
    order = torch.argsort(ordered * 2**32 + tie, stable=True)
    position = torch.arange(n)
    log_w = (1.0 / KEEP - 1.0) * torch.log((position + 0.5) / n)
    weighted = torch.where(position >= (~finite).sum(), log_w + gumbel, -torch.inf)
    return torch.sort(order[torch.topk(weighted, k, sorted=False).indices]).values


def _adam(s: GuardedState, grads: Dicts) -> tuple[Dicts, Dicts, Dicts, torch.Tensor]:
    count = s.count + 1
    c1, c2 = 1 - B1**count, 1 - B2**count
    mu = {n: B1 * s.mu[n] + (1 - B1) * g for n, g in grads.items()}
    nu = {n: B2 * s.nu[n] + (1 - B2) * g * g for n, g in grads.items()}
    params = {n: p - LR * (mu[n] / c1) / ((nu[n] / c2).sqrt() + EPS) for n, p in s.params.items()}
    return params, mu, nu, count


def guarded_step(
    model: nn.Module, select: bool, batch: int
) -> Callable[[GuardedState, torch.Tensor, torch.Tensor], tuple[GuardedState, torch.Tensor]]:
    """The pure step: ``(state, x, y) -> (state after the update, finite)``; the caller
    keeps the update only where ``finite`` holds (:func:`committed`)."""
    call = torch.func.functional_call
    k = max(1, int(KEEP * batch)) if select else batch

    def objective(p: Dicts, x: torch.Tensor, y: torch.Tensor, ok: torch.Tensor) -> tuple:
        losses = F.cross_entropy(call(model, p, (x,)), y, reduction="none")
        used = ok & torch.isfinite(losses.detach())
        kept = torch.where(used, losses, losses.new_zeros(()))
        return kept.mean() * (k / used.sum().to(kept.dtype)), used

    grad_value = torch.func.grad_and_value(objective, has_aux=True)

    def step(
        s: GuardedState, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[GuardedState, torch.Tensor]:
        ok = finite_rows(x)
        unscorable = torch.zeros((), dtype=torch.int64)
        if select:
            with torch.no_grad():
                scores = F.cross_entropy(call(model, s.params, (x,)), y, reduction="none")
            rows = rank_power_rows(scores, sbfunc.random.fold_in(s.key, s.steps), k)
            bad = ~(torch.isfinite(scores) & ok)
            unscorable = bad.index_fill(0, rows, False).sum()
            x, y, ok = x.index_select(0, rows), y.index_select(0, rows), ok.index_select(0, rows)
        x, y = substitute(x, y, ok)
        grads, (loss, used) = grad_value(s.params, x, y, ok)
        flags = [torch.isfinite(loss), *(torch.isfinite(g).all() for g in grads.values())]
        finite = torch.stack(flags).all()
        params, mu, nu, count = _adam(s, grads)
        bad_rows = s.rows_bad + (~used).sum() + unscorable
        new = GuardedState(params, mu, nu, count, s.steps + 1, s.key,
                           s.skipped + (~finite).long(), bad_rows)  # fmt: skip
        return new, finite

    return step


def committed(old: GuardedState, new: GuardedState, finite: torch.Tensor) -> GuardedState:
    """``new``, or ``old``'s parameters and moments with ``new``'s counters when the update
    was not finite: read on the host (a CPU flag: no sync)."""
    if bool(finite):
        return new
    return new._replace(params=old.params, mu=old.mu, nu=old.nu, count=old.count)


def guarded_runner(model: nn.Module, select: bool, batch: int, compiled: bool) -> Callable:
    """``advance(batch)``: one guarded hand-written step (CPU), compiled with
    ``fullgraph=True`` or eager."""
    step = guarded_step(model, select, batch)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    zeros = {n: torch.zeros_like(p) for n, p in params.items()}
    count = torch.zeros((), dtype=torch.int64)
    state = [GuardedState(params, zeros, dict(zeros), count, count.clone(),
                          sbfunc.random.key(0), count.clone(), count.clone())]  # fmt: skip
    call = torch.compile(_own(step), fullgraph=True) if compiled else step

    def advance(b: Batch) -> None:
        new, finite = call(state[0], *b)
        state[0] = committed(state[0], new, finite)

    return advance
