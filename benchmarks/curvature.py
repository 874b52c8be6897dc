"""GGN square-root factors on a subset: sbfunc vs BackPACK 1.7.1, side by side in one run.

Models (2 CPU threads, float32, seeded synthetic MNIST-shaped data), as in
``benchmarks/per_sample.py``:

* ``seed``: BackPACK's sub-sampling example, ``Flatten, Linear(784, 10)``, N=128, samples
  ``[0, 1, 13, 42]`` kept;
* ``cnn``: two conv blocks (conv, ReLU, max-pool) and a linear head, N=256, every other sample
  kept (128).

Rows: exact factors (``sqrt_ggn_exact(subsampling)`` vs ``SqrtGGNExact(subsampling)``) and
Monte-Carlo factors with one sample (``sqrt_ggn_mc(mc_samples=1)`` vs
``SqrtGGNMC(mc_samples=1, subsampling)``), cross-entropy with a mean reduction. Each call
produces the quantity from the model and the batch: BackPACK needs its forward and backward on
the whole batch (its ``subsampling`` applies to the extension only), sbfunc runs the selected
samples only.

Time: the calls alternate (A B A B ..., ``benchmarks/_timing.py``); each round gives a ratio
``backpack / sbfunc`` of the two per-call times measured next to each other; the table shows
the median ms per call and the median ratio with its range over the rounds (> 1: sbfunc faster).
Memory: peak of torch's net CPU allocations during one call (torch profiler, op granularity:
the model's parameters and the batch, allocated before the call, are not counted; BackPACK's
``.grad`` and the factors it stores on the parameters are). The goal of issue 19 is at least
1.5x faster than BackPACK and no more memory, on both models, exact and MC.

Run: ``flock /tmp/sbfunc-bench.lock python benchmarks/curvature.py`` (``--quick`` for a smoke
run). Needs ``pip install --no-deps backpack-for-pytorch==1.7.1 unfoldNd einops``.
"""

from __future__ import annotations

import os

# before torch: on a shared 2-core machine busy-waiting OpenMP threads stall (compiled_step.py)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import copy
import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F
from _timing import interleaved
from per_sample import cnn, peak_mib
from torch import nn

import sbfunc
from sbfunc.per_sample import sqrt_ggn_exact, sqrt_ggn_mc

try:
    import backpack
    from backpack import extensions as bp_ext
except ImportError:  # optional peer
    backpack = None


def contenders(model: nn.Module, x: torch.Tensor, y: torch.Tensor, sub: list[int]) -> dict:
    """{row: {"sbfunc": thunk, "backpack": thunk}} for one model."""
    model.eval()
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    params, buffers = sbfunc.split_module(model)
    batch, key = (x, y), sbfunc.random.key(0)
    exact, mc = sqrt_ggn_exact(loss_fn), sqrt_ggn_mc(loss_fn, mc_samples=1)
    rows: dict[str, dict[str, Callable[[], object]]] = {
        "exact": {"sbfunc": lambda: exact(params, buffers, batch, subsampling=sub)},
        "mc, M=1": {"sbfunc": lambda: mc(params, buffers, batch, key=key, subsampling=sub)},
    }
    if backpack is None:
        return rows
    bp_model = backpack.extend(copy.deepcopy(model))
    bp_loss = backpack.extend(nn.CrossEntropyLoss())

    def bp(extension: object, attr: str) -> Callable[[], object]:
        def run() -> object:
            bp_model.zero_grad(set_to_none=True)
            loss = bp_loss(bp_model(x), y)
            with backpack.backpack(extension):
                loss.backward()
            return [getattr(p, attr) for p in bp_model.parameters()]

        return run

    rows["exact"]["backpack"] = bp(bp_ext.SqrtGGNExact(subsampling=sub), "sqrt_ggn_exact")
    rows["mc, M=1"]["backpack"] = bp(bp_ext.SqrtGGNMC(1, subsampling=sub), "sqrt_ggn_mc")
    return rows


def check_agree(rows: dict) -> None:
    """The exact factors agree with BackPACK's (float32 tolerance)."""
    fns = rows["exact"]
    if "backpack" not in fns:
        return
    ours, theirs = fns["sbfunc"](), fns["backpack"]()
    for a, b in zip(ours.values(), theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few rounds (smoke run)")
    parser.add_argument("--rounds", type=int, default=21, help="interleaved rounds")
    args = parser.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    setups = {
        "seed Linear(784,10) N=128, 4 kept": (
            nn.Sequential(nn.Flatten(), nn.Linear(784, 10)),
            128,
            [0, 1, 13, 42],
        ),
        "cnn N=256, 128 kept": (cnn(), 256, list(range(0, 256, 2))),
    }
    rounds = 3 if args.quick else args.rounds
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, "
        f"BackPACK {'absent' if backpack is None else 'present'}; "
        f"{rounds} interleaved rounds"
    )
    for title, (model, n, sub) in setups.items():
        x, y = torch.randn(n, 1, 28, 28), torch.randint(0, 10, (n,))
        inner = 1 if args.quick else (20 if n == 128 else 2)
        print(f"\n== {title}")
        rows = contenders(model, x, y, sub)
        check_agree(rows)
        for row, fns in rows.items():
            times = interleaved(fns, rounds, inner, warmup=1 if args.quick else 5)
            mem = {k: peak_mib(fn) for k, fn in fns.items()}
            cells = [f"sbfunc {statistics.median(times['sbfunc']) * 1e3:8.2f} ms"]
            cells.append(f"{mem['sbfunc']:7.2f} MiB")
            if "backpack" in fns:
                ratios = sorted(
                    b / a for a, b in zip(times["sbfunc"], times["backpack"], strict=True)
                )
                cells.append(f"| backpack {statistics.median(times['backpack']) * 1e3:8.2f} ms")
                cells.append(f"{mem['backpack']:7.2f} MiB")
                cells.append(
                    f"| time x{statistics.median(ratios):.2f} "
                    f"[{ratios[0]:.2f}-{ratios[-1]:.2f}]"
                    f", memory x{mem['backpack'] / max(mem['sbfunc'], 1e-9):.2f}"
                )
            print(f"{row:9s} " + "  ".join(cells))


if __name__ == "__main__":
    main()
