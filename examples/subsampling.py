"""Mini-batch sub-sampling of per-sample gradients (BackPACK's example, redone with sbfunc).

BackPACK's "Mini-batch sub-sampling" example computes individual gradients of a
``Flatten, Linear`` classifier for samples 0, 1, 13 and 42 of a batch of 128, once naively
(all samples, then slice) and once with ``BatchGrad(subsampling=...)``, and checks that both
agree. Here the same comparison runs on scikit-learn's bundled digits (no download) with
``sbfunc.per_sample.batch_grad``: a pure transform of the per-sample loss function, whose
``subsampling`` argument runs the computation on the selected rows only. Sub-sampled squared
gradient norms (``batch_l2_grad``) are compared the same way, something BackPACK's
``BatchL2Grad`` cannot sub-sample.

sbfunc differentiates each sample's own loss; BackPACK differentiates the batch mean, so its
``grad_batch`` equals ours divided by the batch size (128).

A small CNN (grouped, strided convolutions) is checked too; ``--fast`` skips it.

Run: ``python examples/subsampling.py`` (``--fast`` for a smoke run; both take seconds).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

import sbfunc
from sbfunc.per_sample import batch_grad, batch_l2_grad


def compare(model: nn.Module, batch: tuple, subsampling: list[int]) -> bool:
    """Naive (all, then slice) vs sub-sampled gradients and squared norms; print and return."""
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    params, buffers = sbfunc.split_module(model)

    # naive approach: compute for all, slice out relevant
    grads = batch_grad(loss_fn)
    naive = {k: g[subsampling] for k, g in grads(params, buffers, batch).items()}
    # efficient approach: only the selected samples are run forward and backward
    efficient = grads(params, buffers, batch, subsampling=subsampling)
    match = all(torch.allclose(naive[k], efficient[k], atol=1e-6) for k in naive)
    print(f"  individual gradients match? {match}")

    norms = batch_l2_grad(loss_fn)
    naive_l2 = norms(params, buffers, batch).total[subsampling]
    efficient_l2 = norms(params, buffers, batch, subsampling=subsampling).total
    match_l2 = torch.allclose(naive_l2, efficient_l2, rtol=1e-4)
    print(f"  squared gradient norms match? {match_l2}")
    return match and match_l2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="only the linear model")
    args = parser.parse_args()
    torch.manual_seed(0)
    data = sbfunc.datasets.digits(key=sbfunc.random.key(0))

    print("Flatten + Linear(64, 10), N=128, samples [0, 1, 13, 42]:")
    batch = (data.x_train[:128], data.y_train[:128])
    ok = compare(nn.Sequential(nn.Flatten(), nn.Linear(64, 10)), batch, [0, 1, 13, 42])
    if not args.fast:
        print("small CNN, N=256, every other sample:")
        cnn = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(8, 8, 3, stride=2, groups=2),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(72, 10),
        )
        batch = (data.x_train[:256], data.y_train[:256])
        ok = compare(cnn, batch, list(range(0, 256, 2))) and ok
    if not ok:
        raise ValueError("Naive and efficient sub-sampled quantities don't match.")


if __name__ == "__main__":
    main()
