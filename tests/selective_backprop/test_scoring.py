"""Selective Backprop's cheaper scoring (issue 11): loss reuse, reduced precision, proxy models,
and the downsampling check."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sbfunc
from sbfunc import policies as P
from sbfunc import random as sbrandom

N, IDS = 16, 64


def _data(i):
    k = sbrandom.fold_in(sbrandom.key(5), i)
    x = sbrandom.normal(k, (N, 1, 8))
    y = (x[:, 0, :4].sum(1) > 0).long()
    ids = (torch.arange(N) + N * i) % IDS
    return x, y, ids


def _model(mode_layers=False):
    torch.manual_seed(0)
    layers = [nn.Flatten(), nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)]
    if mode_layers:
        layers.insert(3, nn.Dropout(0.1))
    return nn.Sequential(*layers)


def _run(policy, steps, reuse=None, model=None):
    model = _model() if model is None else model
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    sb = sbfunc.SelectiveBackprop(
        0.0,
        1.0,
        interrupt=0,
        policy=policy,
        ids=2,
        scoring=sbfunc.score.Scoring(reuse_losses=reuse),
    )
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1), [sb])
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbrandom.key(0))
    scored = []
    for i in range(steps):
        before = state.time.samples_forwarded
        state, m = step(state, _data(i))
        scored.append(state.time.samples_forwarded - before - m.samples_backpropagated)
    return sb, state, scored


@pytest.mark.parametrize(
    "policy",
    [
        P.stale_sb(1.0, num_ids=IDS, max_age=3),
        P.loshchilov(keep=0.5, num_ids=IDS),
        P.infobatch(0.5, num_ids=IDS),
    ],
    ids=["stale_sb", "loshchilov", "infobatch"],
)
def test_reused_training_losses_spare_scoring_forwards(policy):
    sb, state, scored = _run(policy, 8, reuse=True)
    assert sb.reuse_losses
    # The first pass over the 64 ids (4 batches) scores what is unseen; the second pass
    # (same ids) scores nothing the training forward of kept rows already recorded.
    assert sum(scored[:4]) == 4 * N
    assert sum(scored[4:]) < sum(scored[:4])
    table = (
        state.algorithm_state[0].table
        if hasattr(state.algorithm_state[0], "table")
        else (state.algorithm_state[0])
    )
    assert bool((table.epoch >= 0).all())  # every id has a recorded loss


def test_reuse_is_on_by_default_only_when_training_and_scoring_losses_agree():
    policy = P.stale_sb(1.0, num_ids=IDS)
    plain = sbfunc.per_sample_loss(_model(), F.cross_entropy, mode="train")
    dropout = sbfunc.per_sample_loss(_model(True), F.cross_entropy, mode="train")

    def sb(loss_fn, **kw):
        scoring = sbfunc.score.Scoring(loss_fn=loss_fn, **kw)
        return sbfunc.SelectiveBackprop(0.0, 1.0, policy=policy, ids=2, scoring=scoring)

    assert sb(plain).reuse_losses
    assert not sb(dropout).reuse_losses  # eval-mode scores differ from train-mode losses
    assert sb(dropout, train=True).reuse_losses
    unbound = sbfunc.SelectiveBackprop(0.0, 1.0, policy=policy, ids=2)
    assert not unbound.reuse_losses  # decided when the step binds its loss
    assert unbound.for_step(loss_fn=plain, per_sample=None).reuse_losses
    assert not unbound.for_step(loss_fn=dropout, per_sample=None).reuse_losses
    assert not sbfunc.SelectiveBackprop(
        0.0, 1.0, policy=P.jiang_cdf(1.0), scoring=sbfunc.score.Scoring(loss_fn=plain)
    ).reuse_losses
    with pytest.raises(ValueError, match="records losses"):
        sbfunc.SelectiveBackprop(
            0.0, 1.0, scoring=sbfunc.score.Scoring(loss_fn=plain, reuse_losses=True)
        )
    with pytest.raises(ValueError, match="ids"):
        sbfunc.SelectiveBackprop(
            0.0, 1.0, policy=policy, scoring=sbfunc.score.Scoring(loss_fn=plain, reuse_losses=True)
        )


def test_reuse_records_the_training_losses_of_the_kept_rows():
    policy = P.infobatch(0.5, num_ids=IDS)
    _, state, _ = _run(policy, 1, reuse=True)
    table = state.algorithm_state[0]
    # batch 0 is unseen: every row kept; the table holds the losses of the training forward
    # at the step's parameters, i.e. the per-sample losses before the update.
    model = _model()
    x, y, ids = _data(0)
    with torch.no_grad():
        expected = F.cross_entropy(model(x), y, reduction="none")
    torch.testing.assert_close(table.loss[ids], expected)


def test_bfloat16_scoring_ranks_like_full_precision():
    model = nn.Sequential(nn.Flatten(), nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    params, buffers = sbfunc.split_module(model)
    x = sbrandom.normal(sbrandom.key(1), (256, 1, 32))
    y = sbrandom.randint(sbrandom.key(2), (256,), 0, 10)
    full = sbfunc.score.score_losses(loss_fn, params, buffers, (x, y))
    low = sbfunc.score.score_losses(loss_fn, params, buffers, (x, y), dtype=torch.bfloat16)
    assert low.dtype == torch.float32
    top_full = set(torch.topk(full, 128).indices.tolist())
    top_low = set(torch.topk(low, 128).indices.tolist())
    assert len(top_full & top_low) >= 0.9 * 128  # the kept halves agree on >= 90% of rows


def test_a_proxy_model_scores_for_a_bigger_one():
    proxy = nn.Sequential(nn.Flatten(), nn.Linear(8, 2))
    proxy_params, _ = sbfunc.split_module(proxy, clone=True)
    proxy_loss = sbfunc.per_sample_loss(proxy, F.cross_entropy)

    def score(params, buffers, batch):  # the trained model's params are ignored
        return proxy_loss(proxy_params, {}, batch)

    model = _model()
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    sb = sbfunc.SelectiveBackprop(
        0.0, 1.0, keep=0.5, interrupt=0, scoring=sbfunc.score.Scoring(loss_fn=score)
    )
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1), [sb])
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbrandom.key(0))
    state, metrics = step(state, _data(0))
    assert metrics.samples_backpropagated == N // 2


def test_downsampled_scoring_that_cannot_fit_the_model_fails_clearly_at_the_first_step():
    model = _model()  # Flatten -> Linear(8, ...): needs the full input length
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    sb = sbfunc.SelectiveBackprop(0.0, 1.0, keep=0.5, scale_factor=0.5)
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1), [sb])
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbrandom.key(0))
    with pytest.raises(ValueError, match=r"only scale_factor=1 works"):
        step(state, _data(0))


def test_downsampled_scoring_names_the_factors_that_work():
    model = nn.Sequential(
        nn.Conv1d(1, 4, 3, padding=1), nn.AdaptiveAvgPool1d(4), nn.Flatten(), nn.Linear(16, 2)
    )
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    params, buffers = sbfunc.split_module(model)
    batch = _data(0)
    sbfunc.score.check_downsampled_scoring(loss_fn, params, buffers, batch, 0.5)  # fits
    with pytest.raises(ValueError, match=r"scale_factor >= 0\.125"):
        sbfunc.score.downsample(batch[0], 0.1)
