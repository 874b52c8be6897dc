"""Ordering of the image algorithms against Selective Backprop (the default passes).

Rule: Selective Backprop scores the raw, full-size batch, downsampled only by its own
``scale_factor`` (never an image that ProgressiveResizing or ColOut already shrank, nor one
that an augmentation changed), and the image algorithms see only the rows it keeps. The
default passes give this order on every event (``keep_selective_backprop_first`` undoes the
FILO reversal of ``AFTER_DATALOADER``), whatever the order of the algorithm list: no extra
pass is needed, and these properties check it.
"""

import warnings

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import sbfunc
from sbfunc import random as sbrandom
from sbfunc.algorithms import AugMix, ColOut, CutMix, ProgressiveResizing, RandAugment
from sbfunc.engine import DEFAULT_PASSES
from sbfunc.testing import algorithm_lists

N, H = 8, 16


def _image_algorithms():
    return [
        AugMix(width=1, depth=1),
        RandAugment(depth=1),
        ColOut(p_row=0.25, p_col=0.25),
        ProgressiveResizing(initial_scale=0.5, delay_fraction=0.5, finetune_fraction=0.0),
        sbfunc.algorithms.CutOut(length=0.25),
        CutMix(num_classes=3),
    ]


def _selective_backprop(loss_fn, scale_factor=1.0):
    return sbfunc.SelectiveBackprop(
        0.0,
        1.0,
        0.5,
        scale_factor=scale_factor,
        interrupt=0,
        scoring=sbfunc.score.Scoring(loss_fn=loss_fn),
    )


def _ordered(algorithms, event):
    out = list(algorithms)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CutMix and MixUp toys may both interpolate the loss
        for p in DEFAULT_PASSES:
            out = p(out, event)
    return out


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(
    algorithm_lists(max_size=4),
    st.permutations(range(7)),
    st.sampled_from([sbfunc.Event.AFTER_DATALOADER, sbfunc.Event.BEFORE_FORWARD]),
)
def test_default_passes_put_selective_backprop_before_every_image_algorithm(toys, order, event):
    images = _image_algorithms()
    sb = _selective_backprop(sbfunc.testing.linear_loss)
    mine = [[*images, sb][i] for i in order]
    ordered = _ordered(toys + mine, event)
    assert sorted(map(id, ordered)) == sorted(map(id, toys + mine))
    selectors = [i for i, a in enumerate(ordered) if a.selects_samples]
    image_positions = [i for i, a in enumerate(ordered) if any(a is b for b in images)]
    assert max(selectors) < min(image_positions)


class _Recorder:
    """A per-sample loss that records the input of every call."""

    def __init__(self, model):
        self.inner = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
        self.seen = []

    def __call__(self, params, buffers, batch):
        self.seen.append(batch[0].detach().clone())
        return self.inner(params, buffers, batch)


@settings(max_examples=8, deadline=None, derandomize=True, database=None)
@given(st.permutations(range(7)), st.sampled_from([1.0, 0.5]))
def test_selective_backprop_scores_the_raw_full_size_batch_in_a_step(order, scale_factor):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3)
    )
    scorer, trainer = _Recorder(model), _Recorder(model)
    images = _image_algorithms()
    everything = [*images, _selective_backprop(scorer, scale_factor)]
    algorithms = [everything[i] for i in order]
    step = sbfunc.make_train_step(trainer, sbfunc.optim.sgd(0.1), algorithms)
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbrandom.key(0), total_steps=10)
    x = sbrandom.uniform(sbrandom.key(1), (N, 3, H, H))
    batch = (x, torch.arange(N) % 3)
    _, metrics = step(state, batch)
    # (with scale_factor != 1 a one-row probe checks the model fits the downsampled input)
    (scored,) = [x for x in scorer.seen if x.shape[0] > 1]
    expected = sbfunc.score.downsample(x, scale_factor)  # the raw batch, at SB's own scale
    assert torch.equal(scored, expected)
    (trained,) = trainer.seen
    assert trained.shape[0] == N // 2 == metrics.samples_backpropagated  # only kept rows
    # ColOut (x 0.75) and ProgressiveResizing (x 0.5, the width it sees pinned to its size
    # increment, as Composer resizes in apply) shrank only the training images
    resize = next(a for a in images if isinstance(a, ProgressiveResizing))
    after_colout = int(H * 0.75)
    pinned = round(after_colout * resize.pinned_scale(0.0, after_colout))
    assert trained.shape[-1] in (int(int(H * 0.5) * 0.75), pinned)


def test_image_algorithms_accept_the_empty_batch_a_refill_step_leaves():
    # With SelectiveBackprop(refill=...), the batch after it may have zero rows on
    # AFTER_DATALOADER and BEFORE_FORWARD; every image algorithm then passes it through.
    batch = (torch.rand(0, 3, 8, 8), torch.zeros(0, dtype=torch.long))
    for alg in _image_algorithms():
        event = (
            sbfunc.Event.BEFORE_FORWARD
            if isinstance(alg, CutMix)
            else sbfunc.Event.AFTER_DATALOADER
        )
        state = sbfunc.Context(sbrandom.key(0), batch=batch, time=sbfunc.Time(elapsed=0.0))
        out = alg.apply(event, state.replace(matched=alg.match(event, state)))
        assert out.batch[0].shape[0] == 0 and out.batch[1].shape[0] == 0
