"""Engine dispatch overhead: the engine's work over one training step's events vs the step.

Measures, in one run and on the same machine:

* the train step of a tiny MLP (64 -> 128 -> 10, batch of 64): ``torch.func.grad`` of the
  mean cross-entropy through ``functional_call`` plus a plain SGD update of the param dict
  (and, for reference, ``sbfunc.make_train_step`` of the same model with no algorithm);
* the engine's dispatch for the 11 per-batch events (``AFTER_DATALOADER`` ... ``BATCH_END``)
  with 10 trivial algorithms (``apply`` returns the state unchanged) and ``DEFAULT_PASSES``,
  done as the training step does it: ``step.plan`` (every ``match`` of the events each
  algorithm listens to, on the host; the order was decided when the step was built and plans
  are cached by decision), then ``apply_planned`` for each event that has matches (each
  application gets the context focused on it, its own key derived from the root key, the
  step, its name and the event, and a trace). Regimes: *dense* (all 10 match every event: 110
  matches and 110 applies per step, the worst case), *sparse* (each algorithm matches one
  event, like real tricks: SB on AFTER_DATALOADER, MixUp on BEFORE_FORWARD, ...) and *idle*
  (none matches); *keyless* repeats dense and sparse with algorithms that declare
  ``uses_key = False`` (deterministic ones: the engine then derives no key, which eagerly is a
  Threefry block on the host per application).

It prints each dispatch time as a ratio of the train step (target: <= 2%), next to the floor
that no engine can go below: a bare Python loop that only calls every ``match`` once and the
matched ``apply`` methods, without passes, keys or traces.

Run: ``python benchmarks/engine.py`` (add ``--quick`` for a smoke run).
"""

from __future__ import annotations

import os

# before torch: on a shared 2-core machine busy-waiting OpenMP threads stall (compiled_step.py)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad

import sbfunc
from sbfunc.engine import Algorithm, Context, Event
from sbfunc.engine.internal import Carry, apply_planned, step_key

sys.path.insert(0, str(Path(__file__).parent))
from selection import timeit

BATCH_EVENTS = sbfunc.step.BATCH_EVENTS


class Trivial(Algorithm):
    """Matches a fixed set of events; ``apply`` returns the state unchanged."""

    def __init__(self, events: frozenset[Event], name: str) -> None:
        self.events = events
        self.name = name

    def match(self, event, state):
        return event in self.events

    def apply(self, event, state):
        return state


class Keyless(Trivial):
    """A :class:`Trivial` that declares it draws nothing: the engine derives no key for it."""

    uses_key = False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="few repeats (smoke run)")
    args = parser.parse_args()
    repeats, inner = (3, 20) if args.quick else (15, 200)
    torch.manual_seed(0)
    torch.set_num_threads(1)

    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    params, buffers = sbfunc.split_module(model)
    x, y = torch.randn(64, 64), torch.randint(0, 10, (64,))

    def loss(p):
        return F.cross_entropy(functional_call(model, (p, buffers), (x,)), y)

    grad_fn = grad(loss)

    def train_step():
        g = grad_fn(params)
        return {k: v - 0.1 * g[k] for k, v in params.items()}

    step_s = timeit(train_step, repeats, inner)
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    sb_step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1))
    sb_state = sb_step.init(params, buffers, key=sbfunc.random.key(0))
    sb_step_s = timeit(lambda: sb_step(sb_state, (x, y)), repeats, inner)
    regimes = {
        "dense (10 x 11 matches)": [Trivial(frozenset(BATCH_EVENTS), f"t{i}") for i in range(10)],
        "sparse (1 event each)": [
            Trivial(frozenset({BATCH_EVENTS[i % len(BATCH_EVENTS)]}), f"t{i}") for i in range(10)
        ],
        "idle (no match)": [Trivial(frozenset(), f"t{i}") for i in range(10)],
        "dense, one shared name": [Trivial(frozenset(BATCH_EVENTS), "t") for _ in range(10)],
        "dense, keyless": [Keyless(frozenset(BATCH_EVENTS), f"t{i}") for i in range(10)],
        "sparse, keyless": [
            Keyless(frozenset({BATCH_EVENTS[i % len(BATCH_EVENTS)]}), f"t{i}") for i in range(10)
        ],
    }
    print(f"tiny MLP train step (grad + SGD, batch 64): {step_s * 1e6:8.1f} us")
    print(f"the same with sbfunc.make_train_step, no algorithm: {sb_step_s * 1e6:8.1f} us")
    for label, algs in regimes.items():
        step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1), algs)
        state = step.init(params, buffers, key=sbfunc.random.key(0))
        view = sbfunc.Context(state.key, params, buffers, batch=(x, y))

        def dispatch(step=step, state=state):
            plan = step.plan(state, (x, y))  # match on the host + the packed time
            time = None if plan.clock is None else plan.clock.time(state.time)
            context = Context(None, params, buffers, state.opt_state, time, batch=(x, y))
            carry = Carry.start(state, context, len(step.leaves))
            if time is not None:
                carry = carry._replace(step_key=step_key(state.key, time.step))
            for event in BATCH_EVENTS:
                planned = step.planner.planned(plan.events, event)
                if planned:
                    carry = apply_planned(event, planned, carry, step.leaves, state.key)
            return carry

        def bare(algs=algs, view=view):
            s = view
            for event in BATCH_EVENTS:
                for alg in [a for a in algs if a.match(event, s)]:
                    s = alg.apply(event, s)
            return s

        d, floor = timeit(dispatch, repeats, inner), timeit(bare, repeats, inner)
        print(
            f"plan + apply x 11 events, 10 algorithms, {label:24s}: {d * 1e6:6.1f} us "
            f"= {100 * d / step_s:5.2f}% of the step "
            f"(bare match/apply calls alone: {floor * 1e6:5.1f} us = {100 * floor / step_s:5.2f}%)"
        )


if __name__ == "__main__":
    main()
