"""A checkpoint written by sbfunc 1.0.0 loads into 1.1 and trains on bit for bit (issue 35,
item 1). The file was written by ``tests/data/make_checkpoint_1_0_0.py`` run against 1.0.0:
adamw, Selective Backprop with label smoothing and EMA, three steps."""

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import sbfunc

CKPT = Path(__file__).parent / "data" / "checkpoint_1_0_0.ckpt"


def _step():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    sb = sbfunc.SelectiveBackprop(start=0.0, end=1.0, keep=0.5, interrupt=0)
    smooth = sbfunc.algorithms.LabelSmoothing(0.1, num_classes=3)
    ema = sbfunc.algorithms.EMA(half_life="2ba")
    step = sbfunc.make_train_step(
        loss_fn, sbfunc.optim.adamw(1e-2), [sbfunc.sequence(sb, smooth), ema]
    )
    params, buffers = sbfunc.split_module(model, clone=True)
    return step, step.init(params, buffers, key=sbfunc.random.key(0), total_steps=10)


def _batches():
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(16, 4, generator=g), torch.randint(0, 3, (16,), generator=g))
        for _ in range(3)
    ]


def test_a_1_0_checkpoint_loads_and_continues_as_the_run_that_wrote_it():
    step, fresh = _step()
    loaded = sbfunc.checkpoint.load(CKPT, like=fresh)
    assert loaded.time.step == 3 and loaded.time.samples_backpropagated == 24
    state = fresh
    for batch in _batches():  # the run that wrote the file, replayed by 1.1
        state, _ = step(state, batch)
    for a, b in zip(
        torch.utils._pytree.tree_leaves(state), torch.utils._pytree.tree_leaves(loaded),
        strict=True,
    ):  # fmt: skip
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b)
        else:
            assert a == b
    g = torch.Generator().manual_seed(9)
    batch = (torch.randn(16, 4, generator=g), torch.randint(0, 3, (16,), generator=g))
    after_a, _ = step(state, batch)
    after_b, _ = step(loaded, batch)
    assert all(torch.equal(after_a.params[k], after_b.params[k]) for k in after_a.params)
