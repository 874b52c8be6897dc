"""Curvature on a subset: BackPACK's sub-sampling example, continued into the GGN.

``examples/subsampling.py`` redoes BackPACK's "Mini-batch sub-sampling" example (individual
gradients of a ``Flatten, Linear`` classifier for samples 0, 1, 13 and 42 of a batch of 128).
BackPACK's second-order extensions ``SqrtGGNExact`` and ``SqrtGGNMC`` take the same
``subsampling`` argument; here their sbfunc counterparts run on the same subset, once naively
(all samples, then slice) and once sub-sampled, and then the quantities BackPACK computes on
the whole batch only are taken on the subset: the GGN diagonal, its per-sample version, a
GGN-vector product and the leading eigenpairs (ViViT). With BackPACK installed the exact
factors are also compared with ``SqrtGGNExact(subsampling=...)``.

A small CNN (every other sample of 256) is checked too; ``--fast`` skips it.

Run: ``python examples/curvature.py`` (``--fast`` for a smoke run; both take seconds).
"""

from __future__ import annotations

import argparse
import copy

import torch
import torch.nn.functional as F
from torch import nn

import sbfunc
from sbfunc.per_sample import (
    batch_diag_ggn_exact,
    diag_ggn_exact,
    ggn_eigen,
    ggn_vector_product,
    sqrt_ggn_exact,
    sqrt_ggn_mc,
)


def close(a: dict, b: dict) -> bool:
    return all(torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-7) for k in a)


def compare(model: nn.Module, batch: tuple, subsampling: list[int]) -> bool:
    """Naive vs sub-sampled curvature, and the subset's eigenpairs; print and return."""
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    params, buffers = sbfunc.split_module(model)
    factors = sqrt_ggn_exact(loss_fn)  # mean reduction over the whole batch, as BackPACK

    # naive approach: compute for all, slice out relevant
    naive = {k: f[:, subsampling] for k, f in factors(params, buffers, batch).items()}
    # efficient approach: only the selected samples are run forward and backward
    efficient = factors(params, buffers, batch, subsampling=subsampling)
    ok = close(naive, efficient)
    shapes = {k: tuple(f.shape) for k, f in efficient.items()}
    print(f"  sqrt GGN factors [C, S, *shape] {shapes} match? {ok}")

    mc = sqrt_ggn_mc(loss_fn, mc_samples=2)
    drawn = mc(params, buffers, batch, key=sbfunc.random.key(0), subsampling=subsampling)
    print(f"  MC factors [M, S, *shape]: {[tuple(f.shape) for f in drawn.values()]}")

    # the GGN diagonal on the subset (BackPACK: whole batch only) is the sum of squared factors
    diag = diag_ggn_exact(loss_fn)(params, buffers, batch, subsampling=subsampling)
    rows = batch_diag_ggn_exact(loss_fn)(params, buffers, batch, subsampling=subsampling)
    squares = {k: f.square().sum((0, 1)) for k, f in efficient.items()}
    ok_diag = close(diag, squares) and close(diag, {k: r.sum(0) for k, r in rows.items()})
    print(f"  GGN diagonal and per-sample diagonals consistent? {ok_diag}")

    # leading eigenpairs from the Gram matrix of the factors; check G v = lambda v
    eig = ggn_eigen(loss_fn, k=3)(params, buffers, batch, subsampling=subsampling)
    top = {k: v[0] for k, v in eig.eigenvectors.items()}
    gv = ggn_vector_product(loss_fn)(params, buffers, batch, top, subsampling=subsampling)
    ok_eig = close(gv, {k: eig.eigenvalues[0] * v for k, v in top.items()})
    values = ", ".join(f"{v:.3g}" for v in eig.eigenvalues.tolist())
    print(f"  leading GGN eigenvalues on the subset: {values}; G v = lambda v? {ok_eig}")
    return ok and ok_diag and ok_eig and backpack_agrees(model, batch, subsampling, efficient)


def backpack_agrees(model: nn.Module, batch: tuple, subsampling: list[int], ours: dict) -> bool:
    """``SqrtGGNExact(subsampling)`` gives the same factors (when BackPACK is installed)."""
    try:
        import backpack
        from backpack.extensions import SqrtGGNExact
    except ImportError:
        print("  (BackPACK not installed: comparison skipped)")
        return True
    bp_model = backpack.extend(copy.deepcopy(model))  # keep the un-extended model for sbfunc
    loss = backpack.extend(nn.CrossEntropyLoss())(bp_model(batch[0]), batch[1])
    with backpack.backpack(SqrtGGNExact(subsampling=subsampling)):
        loss.backward()
    theirs = {k: p.sqrt_ggn_exact for k, p in bp_model.named_parameters()}
    match = close(ours, theirs)
    print(f"  BackPACK's SqrtGGNExact(subsampling=...) matches? {match}")
    return match


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
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 8, 3, groups=2),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(32, 10),
        )
        batch = (data.x_train[:256], data.y_train[:256])
        ok = compare(cnn, batch, list(range(0, 256, 2))) and ok
    if not ok:
        raise ValueError("Naive and efficient sub-sampled curvature don't match.")


if __name__ == "__main__":
    main()
