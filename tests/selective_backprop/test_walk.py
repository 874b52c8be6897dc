"""The walk of a batch through Selective Backprop (issue 42, item 2): the rows are counted once
and the count carried, the ids read once, and a selection enters each module below its package
once, stage by stage (count, score, select, prune, the unscorable rows, the context).

The walk is traced as it runs (``sys.setprofile``): every call into an sbfunc module, with the
module of its caller."""

import sys

import pytest
import torch

import sbfunc
from sbfunc import policies

PACKAGE = "sbfunc.selective_backprop"


def _calls(sb, batch, loss_fields):
    """``(callee module, function, caller module)`` of every sbfunc call of one
    ``SelectiveBackprop.apply`` on ``batch`` (after a first call, so that nothing is first)."""
    model = torch.nn.Linear(4, 3)
    loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy, **loss_fields)
    sb = sb.for_step(loss_fn=loss_fn, per_sample=None)
    ctx = sbfunc.Context(sbfunc.random.key(0), *sbfunc.split_module(model), batch=batch)
    ctx = ctx.replace(own=sb.init(sbfunc.random.key(1)))
    sb.apply(sbfunc.Event.AFTER_DATALOADER, ctx)
    calls = []

    def profile(frame, event, arg):
        module = frame.f_globals.get("__name__", "")
        if event == "call" and module.startswith("sbfunc"):
            caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back else ""
            calls.append((module, frame.f_code.co_name, caller))

    sys.setprofile(profile)
    try:
        sb.apply(sbfunc.Event.AFTER_DATALOADER, ctx)
    finally:
        sys.setprofile(None)
    return calls


X, Y = torch.randn(8, 4), torch.randint(0, 3, (8,))
DICT = {"x": X, "y": Y, "ids": torch.arange(8)}
FIELDS = {"input": "x", "target": "y"}
CASES = {  # name -> (algorithm, batch, loss fields, reads ids)
    "default": (sbfunc.SelectiveBackprop(0.0, 1.0, interrupt=0), (X, Y), {}, False),
    "dict": (sbfunc.SelectiveBackprop(0.0, 1.0, interrupt=0), DICT, FIELDS, False),
    "signals": (
        sbfunc.SelectiveBackprop(0.0, 1.0, interrupt=0, policy=policies.divbs(0.5)),
        (X, Y),
        {},
        False,
    ),
    "ids, some rows scored": (
        sbfunc.SelectiveBackprop(
            0.0, 1.0, interrupt=0, policy=policies.stale_sb(0.5, num_ids=8), ids="ids"
        ),
        DICT,
        FIELDS,
        True,
    ),
    "refill": (
        sbfunc.SelectiveBackprop(
            0.0, 1.0, interrupt=0, policy=policies.top_k(0.5), refill=(X[:6], Y[:6])
        ),
        (X, Y),
        {},
        False,
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_rows_are_counted_once_and_the_ids_read_once(name):
    sb, batch, fields, reads_ids = CASES[name]
    calls = _calls(sb, batch, fields)
    assert [c for c in calls if c[1] == "batch_size"] == [
        ("sbfunc._rows", "batch_size", f"{PACKAGE}._apply")
    ]
    ids = [c for c in calls if c[1] == "extract" and c[2].startswith(PACKAGE)]
    assert len(ids) == reads_ids


# count, score, select, prune, the unscorable rows left out, the context
STAGES = ["_rows", "score", "policies", "batch", "_finite", "engine"]


@pytest.mark.parametrize("name", ["default", "dict", "signals"])
def test_a_selection_enters_each_module_below_it_once_in_stage_order(name):
    """With a policy that reads every score, the calls out of the package go to each module
    once, in one contiguous run per module (each stage's own calls stay below it)."""
    sb, batch, fields, _ = CASES[name]
    runs: list[str] = []
    for module, _, caller in _calls(sb, batch, fields):
        if caller.startswith(PACKAGE) and not module.startswith(PACKAGE):
            top = module.split(".")[1]
            runs += [] if runs and runs[-1] == top else [top]
    assert runs == STAGES
