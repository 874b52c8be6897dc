"""One step reads top to bottom in three files (issue 42, item 2): a traced call of a step
enters ``_train_step.py`` (plan, core, finish), ``_microbatch.py`` (the chunks) and
``_objective.py`` (forward, loss, gradient), and no other module of ``sbfunc.step``; 1.1's
step spanned 8 of its 14 files."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import sbfunc
from sbfunc.selective_backprop import TokenSelection
from tests.helpers import lm_loss, split, tiny_lm

STEP_FILES = {"_train_step.py", "_microbatch.py", "_objective.py"}


def _step_files(call: Callable[[], Any]) -> list[str]:
    """The ``sbfunc/step`` files a call enters, in order of first entry."""
    seen: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if event == "call" and "/sbfunc/step/" in name:
            short = name.rsplit("/", 1)[1]
            if short not in seen:
                seen.append(short)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return seen


def _classifier(algorithms, **options):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    step = sbfunc.make_train_step(sbfunc.per_sample_loss(model, F.cross_entropy),
                                  sbfunc.optim.adam(1e-3), algorithms, **options)  # fmt: skip
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0),
                      total_steps=10)  # fmt: skip
    x = torch.randn(16, 4)
    x[3] = float("nan")  # a row the step sets aside
    return step, state, (x, torch.randint(0, 3, (16,)))


def _language_model(algorithms, **options):
    model = tiny_lm(9)
    step = sbfunc.make_train_step(lm_loss(model), sbfunc.optim.adamw(1e-3), algorithms, **options)
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0),
                      total_steps=10)  # fmt: skip
    ids = torch.randint(0, 257, (6, 9), generator=torch.Generator().manual_seed(0))
    return step, state, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


CASES = {
    "plain": lambda: _classifier([]),
    "selective_backprop": lambda: _classifier([sbfunc.SelectiveBackprop(0.0, 1.0, keep=0.5)]),
    "microbatched": lambda: _classifier([], microbatching=split(chunks=2)),
    "token_selection_microbatched": lambda: _language_model(
        [TokenSelection(0.5, score="loss")], microbatching=split(chunks=3)
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_step_reads_in_three_files(case):
    step, state, batch = CASES[case]()
    state, _ = step(state, batch)  # warm: the plan cache, first-call checks
    files = _step_files(lambda: step(state, batch))
    assert set(files) <= STEP_FILES and files[0] == "_train_step.py", files
