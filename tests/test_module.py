import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sbfunc


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 3))


def test_split_module_detached_and_named():
    model = _model()
    params, buffers = sbfunc.split_module(model)
    assert set(params) == {n for n, _ in model.named_parameters()}
    assert set(buffers) == {n for n, _ in model.named_buffers()}
    assert not any(p.requires_grad for p in params.values())
    assert params["0.weight"].data_ptr() == model[0].weight.data_ptr()
    cloned, _ = sbfunc.split_module(model, clone=True)
    assert cloned["0.weight"].data_ptr() != model[0].weight.data_ptr()


def test_eval_mode_scores_are_deterministic_and_leave_buffers_alone():
    model = _model().train()
    params, buffers = sbfunc.split_module(model, clone=True)
    before = {k: v.clone() for k, v in buffers.items()}
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)  # train=False by default
    batch = (torch.randn(16, 4), torch.randint(0, 3, (16,)))
    a, b = loss_fn(params, buffers, batch), loss_fn(params, buffers, batch)
    assert torch.equal(a, b) and a.shape == (16,)
    assert all(torch.equal(before[k], buffers[k]) for k in buffers)
    assert model.training  # mode restored


def test_train_mode_uses_dropout_and_restores_mode():
    model = _model().eval()
    params, buffers = sbfunc.split_module(model, clone=True)
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, train=True)
    batch = (torch.randn(16, 4), torch.randint(0, 3, (16,)))
    torch.manual_seed(0)
    a = loss_fn(params, buffers, batch)
    b = loss_fn(params, buffers, batch)
    assert not torch.equal(a, b)
    assert not model.training


def test_dict_batches_and_criterion_forms():
    model = nn.Linear(4, 3)
    params, buffers = sbfunc.split_module(model)
    batch = {"image": torch.randn(5, 4), "label": torch.randint(0, 3, (5,)), "id": torch.arange(5)}
    f1 = sbfunc.per_sample_loss(model, F.cross_entropy, input="image", target="label")
    f2 = sbfunc.per_sample_loss(
        model, nn.CrossEntropyLoss(reduction="none"), input="image", target="label"
    )
    f3 = sbfunc.per_sample_loss(
        model, lambda o, t: F.cross_entropy(o, t, reduction="none"), input="image", target="label"
    )
    ref = F.cross_entropy(model(batch["image"]), batch["label"], reduction="none")
    for f in (f1, f2, f3):
        torch.testing.assert_close(f(params, buffers, batch), ref)


def test_element_losses_reduced_by_mean():
    model = nn.Conv1d(2, 3, 1)  # per-position logits: [N, C, L]
    params, buffers = sbfunc.split_module(model)
    x, y = torch.randn(4, 2, 5), torch.randint(0, 3, (4, 5))
    loss = sbfunc.per_sample_loss(model, F.cross_entropy)(params, buffers, (x, y))
    ref = F.cross_entropy(model(x), y, reduction="none").mean(dim=1)
    torch.testing.assert_close(loss, ref)


def test_reducing_criterion_rejected():
    with pytest.raises(ValueError, match="reduction='none'"):
        sbfunc.per_sample_loss(nn.Linear(2, 2), nn.CrossEntropyLoss())
    with pytest.raises(TypeError, match="criterion must be callable"):
        sbfunc.per_sample_loss(nn.Linear(2, 2), "ce")
    with pytest.raises(TypeError, match=r"module must be an nn\.Module"):
        sbfunc.per_sample_loss(lambda x: x, F.cross_entropy)
    with pytest.raises(TypeError, match="train must be"):
        sbfunc.per_sample_loss(nn.Linear(2, 2), F.cross_entropy, train="yes")


def test_scalar_loss_rejected_at_call():
    model = nn.Linear(2, 2)
    params, buffers = sbfunc.split_module(model)
    loss_fn = sbfunc.per_sample_loss(model, lambda o, t: ((o - t) ** 2).mean())
    with pytest.raises(ValueError, match="per-sample"):
        loss_fn(params, buffers, (torch.randn(3, 2), torch.randn(3, 2)))


def test_loss_fn_composes_with_grad():
    model = nn.Linear(3, 2)
    params, buffers = sbfunc.split_module(model)
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    batch = (torch.randn(6, 3), torch.randint(0, 2, (6,)))
    grads = torch.func.grad(lambda p: loss_fn(p, buffers, batch).mean())(params)
    model.zero_grad()
    F.cross_entropy(model(batch[0]), batch[1]).backward()
    torch.testing.assert_close(grads["weight"], model.weight.grad)
