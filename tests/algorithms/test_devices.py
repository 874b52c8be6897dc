"""Every algorithm of the suite, with Selective Backprop, in a step on the ``meta`` device
(tensors without data): no host read and no device mix anywhere in the step, eagerly, with
and without microbatching (docs/how-to/compile.md lists the places that do read)."""

import pytest
import torch

import sbfunc
from sbfunc import random as sbrandom
from tests.algorithms.test_registry import CASES, ImageNet, TokenNet, _data, _loss, _sb
from tests.helpers import split
from tests.meta import META, all_meta
from tests.meta import to_meta as _meta


@pytest.mark.parametrize("microbatch_size", [None, 3])
@pytest.mark.parametrize("name", list(CASES))
def test_a_step_with_the_algorithm_never_reads_the_device(name, microbatch_size):
    case = CASES[name]
    torch.manual_seed(0)
    model = case.surgery(ImageNet() if case.kind == "image" else TokenNet())
    train = _loss(model, case.kind, "train")
    algorithms = [*case.algorithms(model, train), _sb(model, case.kind)]
    optimizer = sbfunc.optim.sgd(0.1) if case.optimizer is None else case.optimizer
    step = sbfunc.make_train_step(
        train, optimizer, algorithms, microbatching=split(size=microbatch_size)
    )
    params, buffers = _meta(sbfunc.split_module(model, clone=True))
    state = step.init(params, buffers, key=sbrandom.key(0).to(META), total_steps=6)
    for batch in _data(case.kind)[:2]:
        state, metrics = step(state, _meta(batch))
    assert "SelectiveBackprop" in {t.name for t in metrics.traces}  # SB selected
    assert all_meta(state)
