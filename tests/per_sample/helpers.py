"""Shared models and the per-sample ``torch.autograd`` loop the transforms are checked against."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import sbfunc


def loop_grads(loss_fn, params, buffers, batch, names=None, indices=None):
    """Per-sample gradients by one ``torch.autograd.grad`` per sample (the reference)."""
    names = list(params) if names is None else names
    n = sbfunc.batch.batch_size(batch)
    rows = range(n) if indices is None else [int(i) for i in indices]
    out = {k: [] for k in names}
    for i in rows:
        p = {k: v.detach().requires_grad_(k in names) for k, v in params.items()}
        loss = loss_fn(p, buffers, sbfunc.batch.take(batch, torch.tensor([i])))[0]
        grads = torch.autograd.grad(loss, [p[k] for k in names], allow_unused=True)
        for k, g in zip(names, grads, strict=True):
            out[k].append(torch.zeros_like(p[k]) if g is None else g)
    return {k: torch.stack(v) for k, v in out.items()}


class Mixed(nn.Module):
    """Linear on sequences, conv with groups/stride/dilation, LayerNorm (fallback), tied use."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, stride=2, padding=1, dilation=1, groups=2)
        self.conv2 = nn.Conv1d(4, 3, 2, dilation=2, padding="same", bias=False)
        self.norm = nn.LayerNorm(3)
        self.seq = nn.Linear(3, 5)
        self.head = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x))  # [N, 4, 3, 3]
        h = self.conv2(h.flatten(2))  # [N, 3, 9]
        h = self.norm(h.transpose(1, 2))  # [N, 9, 3]
        h = torch.tanh(self.seq(h)).mean(1)  # [N, 5]
        return self.head(h) + 0.1 * self.head.weight.sum()  # weight used twice -> fallback


def models():
    """(name, model, batch of N=6) in float64, seeded."""
    torch.manual_seed(0)
    cases = [
        ("seed", nn.Sequential(nn.Flatten(), nn.Linear(16, 3)), torch.randn(6, 1, 4, 4)),
        (
            "cnn",
            nn.Sequential(
                nn.Conv2d(1, 3, 3, padding=1),
                nn.ReLU(inplace=True),
                nn.Conv2d(3, 2, 2, stride=2),
                nn.Flatten(),
                nn.Linear(8, 3),
            ),
            torch.randn(6, 1, 4, 4),
        ),
        ("mixed", Mixed(), torch.randn(6, 2, 6, 6)),
        (
            "conv3d",
            nn.Sequential(nn.Conv3d(1, 2, 2, padding=(0, 1, 0)), nn.Flatten(), nn.LazyLinear(3)),
            torch.randn(6, 1, 3, 3, 3),
        ),
    ]
    out = []
    for name, model, x in cases:
        model = model.double()
        model(x.double())  # materialize lazy modules
        out.append((name, model, (x.double(), torch.randint(0, 3, (6,)))))
    return out


def setup(name):
    model, batch = next((m, b) for n, m, b in models() if n == name)
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    params, buffers = sbfunc.split_module(model)
    return loss_fn, params, buffers, batch


NAMES = [name for name, _, _ in models()]


class Recurrent(nn.Module):
    """A recurrent layer on ``[N, T, F]`` inputs (transposed for ``batch_first=False``) and a
    Linear head on the last step."""

    def __init__(self, cell: type[nn.RNNBase], batch_first: bool) -> None:
        super().__init__()
        self.rnn = cell(3, 4, num_layers=2, batch_first=batch_first)
        self.head = nn.Linear(4, 2)
        self.batch_first = batch_first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.rnn(x if self.batch_first else x.transpose(0, 1))[0]
        return self.head(h[:, -1] if self.batch_first else h[-1])


def recurrent(cell, batch_first, dtype, n=5):
    """``(loss_fn, params, buffers, batch)`` for a seeded :class:`Recurrent` model."""
    torch.manual_seed(0)
    model = Recurrent(cell, batch_first).to(dtype)
    batch = (torch.randn(n, 6, 3, dtype=dtype), torch.randint(0, 2, (n,)))
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    params, buffers = sbfunc.split_module(model)
    return loss_fn, params, buffers, batch


# --- curvature (GGN) references -------------------------------------------------------------

CRITERIA = {
    "ce": F.cross_entropy,
    "mse": F.mse_loss,
    "bce": F.binary_cross_entropy_with_logits,
}


def targets(kind, out_shape, n, generator=None):
    """Targets for ``n`` samples of a criterion, for outputs ``[n, *out_shape]``."""
    g = torch.Generator().manual_seed(1) if generator is None else generator
    if kind == "ce":
        return torch.randint(0, out_shape[0], (n, *out_shape[1:]), generator=g)
    t = torch.rand(n, *out_shape, generator=g, dtype=torch.float64)
    return t if kind == "bce" else t * 4 - 2


def ggn_reference(loss_fn, params, buffers, batch, indices, reduction, names=None):
    """The GGN ``sum_i J_i^T H_i J_i`` of the selected samples (repeats count) as a dense
    ``[P, P]`` matrix over the named parameters, concatenated in order, from ``jacrev`` of the
    output and ``hessian`` of the criterion with torch's own ``reduction`` semantics."""
    from torch.func import hessian, jacrev

    names = list(params) if names is None else names
    n = sbfunc.batch.batch_size(batch)
    crit = loss_fn.raw_criterion
    terms = []
    for i in indices:
        sample = sbfunc.batch.take(batch, torch.tensor([int(i)]))
        target = sbfunc.batch.extract(sample, loss_fn.target, "target")

        def out_fn(diff, sample=sample):
            return loss_fn.forward({**params, **diff}, buffers, sample)

        diff = {k: params[k] for k in names}
        out = out_fn(diff)
        elements = crit(out, target, reduction="none").numel()
        scale = 1.0 / (n * elements) if reduction == "mean" else 1.0
        h = hessian(
            lambda o, target=target, scale=scale: crit(o, target, reduction="sum") * scale
        )(out)
        k_out = out.numel()
        jac = jacrev(out_fn)(diff)
        j = torch.cat([jac[k].reshape(k_out, -1) for k in names], dim=1)
        terms.append(j.T @ h.reshape(k_out, k_out) @ j)
    return torch.stack(terms)  # [S, P, P]: per-sample terms


def factors_matrix(factors, names=None):
    """Factors ``{name: [R, S, *shape]}`` as one ``[R, S, P]`` tensor."""
    names = list(factors) if names is None else names
    return torch.cat([factors[k].flatten(2) for k in names], dim=2)


def split_like(vector, params, names=None):
    """A flat ``[..., P]`` tensor as a dict of parameter-shaped tensors."""
    names = list(params) if names is None else names
    out, start = {}, 0
    for k in names:
        size = params[k].numel()
        out[k] = vector[..., start : start + size].reshape(*vector.shape[:-1], *params[k].shape)
        start += size
    return out
