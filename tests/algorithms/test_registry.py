"""Every algorithm of the suite trains with Selective Backprop under ``fit`` and resumes from a
checkpoint bit for bit.

One case per entry of Composer's algorithm table (plus EMA): the algorithm built with small
settings on a model and batch it fits (images for image ones, token ids for sequence ones,
module surgery where it needs one), listed with ``SelectiveBackprop``, trained for two epochs
of three batches with a checkpoint every two steps; the run resumed in this process from the
step-2 file must end in exactly the state of the uninterrupted run.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sbfunc
from sbfunc import algorithms as A
from sbfunc import random as sbrandom
from tests.helpers import assert_identical

N, H, CLASSES, VOCAB, LENGTH = 8, 16, 3, 12, 8


def _unchanged(module: nn.Module) -> nn.Module:
    return module


class Case(NamedTuple):
    """A model (after surgery), its algorithms and, optionally, an optimizer or a duration."""

    kind: str  # "image" or "tokens"
    surgery: Callable[[nn.Module], nn.Module] = _unchanged
    algorithms: Callable[[nn.Module, Any], list[sbfunc.Algorithm]] = lambda m, loss: []
    optimizer: Any = None
    epochs: int = 2


class ImageNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.pool = nn.MaxPool2d(2)
        self.block = Residual(nn.Conv2d(16, 16, 3, padding=1))
        self.down = nn.Conv2d(16, 16, 3, stride=2, padding=1)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, CLASSES))

    def forward(self, x):
        x = self.pool(torch.relu(self.bn(self.stem(x))))
        return self.head(torch.relu(self.down(self.block(x))))


class Residual(nn.Module):
    def __init__(self, branch):
        super().__init__()
        self.branch = branch

    def forward(self, x):
        return x + self.branch(x)


class TokenNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, 8)
        self.position_embeddings = nn.Embedding(LENGTH, 8)
        layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(8, VOCAB)

    def forward(self, ids):
        positions = torch.arange(ids.shape[1], device=ids.device)
        h = self.tokens(ids) + self.position_embeddings(positions)
        return self.head(self.encoder(h)).transpose(1, 2)  # [N, vocab, L]


def _data(kind):
    g = torch.Generator().manual_seed(1)
    if kind == "image":
        return [
            (torch.rand(N, 3, H, H, generator=g), torch.randint(0, CLASSES, (N,), generator=g))
            for _ in range(3)
        ]
    out = []
    for _ in range(3):
        ids = torch.randint(0, VOCAB, (N, LENGTH), generator=g)
        out.append({"input_ids": ids, "labels": ids.roll(-1, 1)})
    return out


def _loss(model, kind, mode):
    fields = {} if kind == "image" else {"input": "input_ids", "target": "labels"}
    return sbfunc.per_sample_loss(model, F.cross_entropy, mode=mode, **fields)


def _sb(model, kind):
    return sbfunc.SelectiveBackprop(
        0.0,
        1.0,
        keep=0.5,
        interrupt=0,
        scoring=sbfunc.score.Scoring(loss_fn=_loss(model, kind, "eval")),
    )


CASES = {
    "ALiBi": Case(
        "tokens",
        A.Alibi(max_sequence_length=LENGTH, train_sequence_length_scaling=0.5),
        lambda m, loss: [A.Alibi(max_sequence_length=LENGTH, train_sequence_length_scaling=0.5)],
    ),
    "AugMix": Case("image", algorithms=lambda m, loss: [A.AugMix(severity=3, depth=1, width=2)]),
    "BlurPool": Case(
        "image", A.BlurPool(min_channels=3), lambda m, loss: [A.BlurPool(min_channels=3)]
    ),
    "ChannelsLast": Case("image", algorithms=lambda m, loss: [A.ChannelsLast()]),
    "ColOut": Case("image", algorithms=lambda m, loss: [A.ColOut(p_row=0.25, p_col=0.25)]),
    "CutMix": Case("image", algorithms=lambda m, loss: [A.CutMix(num_classes=CLASSES)]),
    "CutOut": Case("image", algorithms=lambda m, loss: [A.CutOut(length=0.25)]),
    "Decoupled Weight Decay": Case(
        "image", optimizer=sbfunc.optim.decoupled_sgdw(0.1, momentum=0.9, weight_decay=1e-2)
    ),
    "Decoupled Weight Decay (AdamW)": Case(
        "image", optimizer=sbfunc.optim.decoupled_adamw(1e-2, weight_decay=1e-2)
    ),
    "Ghost BatchNorm": Case("image", A.GhostBatchNorm(ghost_batch_size=2)),
    "Label Smoothing": Case(
        "image", algorithms=lambda m, loss: [A.LabelSmoothing(0.1, num_classes=CLASSES)]
    ),
    "Layer Freezing": Case(
        "image", algorithms=lambda m, loss: [A.LayerFreezing(0.0, 0.5, layers=m)]
    ),
    "MixUp": Case("image", algorithms=lambda m, loss: [A.MixUp(0.4, num_classes=CLASSES)]),
    "Progressive Resizing": Case(
        "image",
        algorithms=lambda m, loss: [
            A.ProgressiveResizing(initial_scale=0.5, delay_fraction=0.0, finetune_fraction=0.2)
        ],
    ),
    "RandAugment": Case("image", algorithms=lambda m, loss: [A.RandAugment(depth=1)]),
    "Scale Schedule": Case(
        "image",
        optimizer=sbfunc.optim.sgd(
            A.scale_schedule(sbfunc.optim.cosine_decay_schedule(0.1, 12), 0.5)
        ),
        epochs=A.scale_schedule(sbfunc.engine.Duration(epochs=4), 0.5).epochs,
    ),
    "Selective Backprop": Case("image"),  # alone with itself
    "Sequence Length Warmup": Case(
        "tokens",
        algorithms=lambda m, loss: [
            A.SeqLengthWarmup(duration=0.5, min_seq_length=4, max_seq_length=LENGTH, step_size=2)
        ],
    ),
    "Sharpness Aware Minimization": Case(
        "image", algorithms=lambda m, loss: [A.SAM(rho=0.05, loss_fn=loss)]
    ),
    "Squeeze-and-Excitation": Case("image", A.SqueezeExcite(latent_channels=4, min_channels=16)),
    "Stochastic Depth (Blockwise)": Case(
        "image",
        A.StochasticDepth(["block.branch"], "block", 0.5, drop_warmup=0.5),
        lambda m, loss: [A.StochasticDepth(["block.branch"], "block", 0.5, drop_warmup=0.5)],
    ),
    "Stochastic Depth (Sample-Wise)": Case(
        "image",
        A.StochasticDepth(["block.branch"], "sample", 0.5, drop_warmup=0.5),
        lambda m, loss: [A.StochasticDepth(["block.branch"], "sample", 0.5, drop_warmup=0.5)],
    ),
    "Stochastic Weight Averaging": Case(
        "image", algorithms=lambda m, loss: [A.SWA(0.0, 0.9, "1ba")]
    ),
    "EMA": Case("image", algorithms=lambda m, loss: [A.EMA(smoothing=0.9)]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_trains_with_selective_backprop_and_resumes_bit_for_bit(name, tmp_path):
    case = CASES[name]
    torch.manual_seed(0)
    plain = ImageNet() if case.kind == "image" else TokenNet()
    model = case.surgery(plain)
    if case.surgery is not _unchanged:  # the surgery replaced some layers
        assert {type(m) for m in model.modules()} != {type(m) for m in plain.modules()}
    train = _loss(model, case.kind, "train")
    extra = case.algorithms(model, train)
    algorithms = [*extra, _sb(model, case.kind)]
    optimizer = sbfunc.optim.sgd(0.1) if case.optimizer is None else case.optimizer
    step = sbfunc.make_train_step(train, optimizer, algorithms)
    fresh = step.init(*sbfunc.split_module(model, clone=True), key=sbrandom.key(0))
    data = _data(case.kind)
    run = {"epochs": case.epochs, "progress": False}
    whole = sbfunc.fit(
        step,
        fresh,
        data,
        **run,
        checkpointing=sbfunc.step.Checkpointing(
            save_to=tmp_path / "s{step}.pt", every=sbfunc.engine.Duration(steps=2)
        ),
    )
    t = whole.state.time
    assert t.step == 3 * case.epochs and t.samples_backpropagated < t.samples_forwarded
    assert all(torch.isfinite(m.loss) for m in whole.history)
    assert any(not torch.equal(whole.state.params[k], fresh.params[k]) for k in fresh.params)
    traced = {t.name for m in whole.history for t in m.traces}
    for alg in extra:  # each one ran inside the steps (ChannelsLast on INIT, BlurPool never)
        assert isinstance(alg, A.ChannelsLast | A.BlurPool) or alg.name in traced
    resumed = sbfunc.fit(
        step,
        fresh,
        data,
        **run,
        checkpointing=sbfunc.step.Checkpointing(load_from=tmp_path / "s2.pt"),
    ).state
    assert_identical(resumed, whole.state)


def test_every_algorithm_of_the_suite_has_a_case():
    """A new algorithm class in sbfunc.algorithms must get a case here."""
    covered = {
        A.Alibi,
        A.AugMix,
        A.BlurPool,
        A.ChannelsLast,
        A.ColOut,
        A.CutMix,
        A.CutOut,
        A.GhostBatchNorm,
        A.LabelSmoothing,
        A.LayerFreezing,
        A.MixUp,
        A.ProgressiveResizing,
        A.RandAugment,
        A.SeqLengthWarmup,
        A.SAM,
        A.SqueezeExcite,
        A.StochasticDepth,
        A.SWA,
        A.EMA,
    }
    suite = {
        obj
        for obj in map(A.__dict__.get, A.__all__)
        if isinstance(obj, type)
        and (issubclass(obj, sbfunc.Algorithm) or issubclass(obj, A.Surgery))
        and obj is not A.Surgery
    }
    assert suite == covered
