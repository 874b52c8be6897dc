"""Step configurations whose eager results are pinned bit for bit against sbfunc 1.0.0.

``tests/data/golden_1_0_0.json`` holds, for each configuration, a SHA-256 of the parameters,
the optimizer state and the losses after a few eager steps, written by sbfunc 1.0.0 with
``python tests/golden_configs.py --write`` (run against a checkout of the 1.0.0 tag).
``tests/test_golden.py`` recomputes them with the code under test: a refactor must not change
a single bit where the randomness did not change on purpose (the CHANGELOG says where it did).
Where it did, ``tests/data/golden_1_1_0.json`` holds the value the configuration has had since
(written with ``python -m tests.golden_configs --write-1.1 NAME ...`` by the code that changed
it) and ``tests/test_golden.py`` says why; the 1.0.0 file is never rewritten.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import optree
import torch
import torch.nn.functional as F
from torch import nn

import sbfunc

GOLDEN = Path(__file__).parent / "data" / "golden_1_0_0.json"
GOLDEN_1_1 = Path(__file__).parent / "data" / "golden_1_1_0.json"
STEPS = 4
N, D, C = 24, 6, 4


def _model(dropout: bool = False) -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Linear(D, 16), nn.ReLU()]
    if dropout:
        layers.append(nn.Dropout(0.2))
    return nn.Sequential(*layers, nn.Linear(16, C))


def _batches(ids: bool = False) -> list:
    g = torch.Generator().manual_seed(1)
    out = []
    for s in range(STEPS):
        x = torch.randn(N, D, generator=g)
        y = torch.randint(0, C, (N,), generator=g)
        if ids:
            out.append({"x": x, "y": y, "ids": torch.arange(N) + s * N})
        else:
            out.append((x, y))
    return out


def _policies() -> dict:
    p = sbfunc.policies
    table = torch.linspace(0.1, 2.0, N * STEPS)
    return {
        "rank_power": (p.rank_power(0.5), False),
        "top_k": (p.top_k(0.5), False),
        "random_subset": (p.random_subset(0.5), False),
        "jiang_cdf": (p.jiang_cdf(beta=1.0), False),
        "stale_sb": (p.stale_sb(beta=1.0, num_ids=N * STEPS), True),
        "loshchilov": (p.loshchilov(keep=0.5, num_ids=N * STEPS), True),
        "grad_norm_importance": (p.grad_norm_importance(0.5), False),
        "rho_loss": (p.rho_loss(0.5, table), True),
        "infobatch": (p.infobatch(num_ids=N * STEPS), True),
        "divbs": (p.divbs(0.5), False),
        "bayesian": (p.bayesian(0.5, num_features=16, num_classes=C, draws=8), False),
    }


def configs() -> dict:
    """name -> (loss_fn, optimizer, algorithms, step options, batches)."""
    ce = F.cross_entropy
    tuple_loss = sbfunc.per_sample_loss(_model(), ce)
    out = {
        "plain_adam": (tuple_loss, sbfunc.optim.adam(1e-2), [], {}, _batches()),
        "plain_sgd_momentum": (
            tuple_loss,
            sbfunc.optim.sgd(0.1, momentum=0.9),
            [],
            {},
            _batches(),
        ),
        "plain_adamw_microbatch": (
            tuple_loss,
            sbfunc.optim.adamw(1e-2),
            [],
            {"microbatches": 3},
            _batches(),
        ),
        "dropout_keyed": (
            sbfunc.per_sample_loss(_model(dropout=True), ce),
            sbfunc.optim.adam(1e-2),
            [],
            {},
            _batches(),
        ),
    }
    for name, (policy, ids) in _policies().items():
        loss = sbfunc.per_sample_loss(_model(), ce, input="x", target="y") if ids else tuple_loss
        sb = sbfunc.SelectiveBackprop(
            start=0.0, end=1.0, interrupt=0, policy=policy, ids="ids" if ids else None
        )
        out[f"sb_{name}"] = (loss, sbfunc.optim.adam(1e-2), [sb], {}, _batches(ids))
    sb = sbfunc.SelectiveBackprop(start=0.0, end=1.0, keep=0.5, interrupt=0)
    a = sbfunc.algorithms
    out["sb_microbatch_smoothing"] = (
        tuple_loss,
        sbfunc.optim.adam(1e-2),
        [sbfunc.sequence(sb, a.LabelSmoothing(0.1, num_classes=C))],
        {"microbatch_size": 5},
        _batches(),
    )
    out["mixup_sam_ema"] = (
        tuple_loss,
        sbfunc.optim.sgd(0.05),
        [a.MixUp(0.2, num_classes=C), a.SAM(rho=0.05, loss_fn=tuple_loss), a.EMA(half_life="2ba")],
        {},
        _batches(),
    )
    return out  # fmt: skip


def digest(name: str) -> str:
    loss_fn, opt, algorithms, options, batches = configs()[name]
    step = sbfunc.make_train_step(loss_fn, opt, algorithms, **options)
    params, buffers = sbfunc.split_module(loss_fn.module, clone=True)
    state = step.init(params, buffers, key=sbfunc.random.key(7), total_steps=STEPS)
    h = hashlib.sha256()
    for batch in batches:
        state, metrics = step(state, batch)
        h.update(metrics.loss.detach().numpy().tobytes())
    for leaf in optree.tree_leaves((state.params, state.opt_state, state.algorithm_state)):
        if isinstance(leaf, torch.Tensor):
            h.update(leaf.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


if __name__ == "__main__" and "--write" in sys.argv:
    GOLDEN.write_text(json.dumps({n: digest(n) for n in configs()}, indent=1) + "\n")
    print(GOLDEN.read_text())
elif __name__ == "__main__" and "--write-1.1" in sys.argv:
    names = sys.argv[sys.argv.index("--write-1.1") + 1 :]
    old = json.loads(GOLDEN_1_1.read_text()) if GOLDEN_1_1.exists() else {}
    GOLDEN_1_1.write_text(json.dumps({**old, **{n: digest(n) for n in names}}, indent=1) + "\n")
    print(GOLDEN_1_1.read_text())
