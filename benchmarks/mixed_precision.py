"""Mixed precision on the quickstart CNN: test accuracy and step time, fp32 against amp_bf16.

For each seed it trains ``examples/quickstart.py``'s CNN on MNIST-1D (generated offline, the
quickstart's loader: ``sbfunc.datasets.batches`` with a key per epoch) with Adam and a cosine
learning rate, once with ``make_train_step(..., precision="fp32")`` and once with
``precision="amp_bf16"`` (forward and loss under bfloat16 autocast, float32 master weights),
from the same initial weights on the same batches, and evaluates both in float32. It prints
the test accuracy of each precision as mean +- std over the seeds, then times one training
step of each interleaved (A B A B ..., ``benchmarks/_timing.py``) and prints the
``amp_bf16 / fp32`` step-time ratio (median, [min-max] of the per-round ratios). On a CPU
without bfloat16 units (no ``avx512_bf16``/``amx_bf16``) autocast adds casts and bfloat16
kernels are slow: on the 2-core development CPU the ``--quick`` run measured the bfloat16
step about 24x slower at the quickstart's width 128 (3.2 s against 0.13 s), so the full run
takes about half an hour there; on a GPU or a CPU with bfloat16 units it is the other way.

Run: ``python benchmarks/mixed_precision.py`` (``--quick`` for a smoke run, a narrow CNN;
``--seeds``, ``--epochs``, ``--samples``, ``--width`` and ``--threads`` to change the
defaults).
"""

from __future__ import annotations

import os

# The machine is shared: with busy-waiting OpenMP threads, a 2-thread team stalls whenever
# another process holds one of the 2 cores (10x outliers); passive waiting degrades gracefully.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import statistics
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

import sbfunc

_ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(_ROOT / "benchmarks"), str(_ROOT / "examples")]
import quickstart  # noqa: E402  (the model and batch size)
from _timing import interleaved  # noqa: E402

PRECISIONS = ("fp32", "amp_bf16")
LR = 3e-3


def make_step(model: torch.nn.Module, precision: str, total: int) -> sbfunc.step.TrainStep:
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    opt = sbfunc.optim.adam(sbfunc.optim.cosine_decay_schedule(LR, total))
    return sbfunc.make_train_step(loss_fn, opt, precision=precision)  # type: ignore[arg-type]


def accuracy(
    data: sbfunc.datasets.Split, seed: int, epochs: int, precision: str, width: int
) -> float:
    """Test accuracy after ``epochs`` epochs from the seed's weights and batch order."""
    torch.manual_seed(seed)
    model = quickstart.make_model(width)
    per_epoch = data.x_train.shape[0] // quickstart.BATCH
    step = make_step(model, precision, epochs * per_epoch)
    key = sbfunc.random.key(seed)
    state = step.init(*sbfunc.split_module(model, clone=True), key=key)

    def batches(epoch: int) -> Iterator[tuple[torch.Tensor, ...]]:  # the quickstart's loader
        k = sbfunc.random.fold_in(key, epoch)
        return sbfunc.datasets.batches(data.x_train, data.y_train, quickstart.BATCH, key=k)

    result = sbfunc.fit(
        step, state, batches, epochs=epochs, steps_per_epoch=per_epoch, progress=False,
        history=False,
    )  # fmt: skip
    with torch.no_grad():
        logits = sbfunc.predict(model, result.state.params, result.state.buffers, data.x_test)
    return float((logits.argmax(1) == data.y_test).float().mean())


def step_times(
    data: sbfunc.datasets.Split, repeats: int, inner: int, width: int
) -> dict[str, list[float]]:
    """Seconds per step of each precision on the same batch, interleaved."""
    batch = (data.x_train[: quickstart.BATCH], data.y_train[: quickstart.BATCH])
    fns: dict[str, Callable[[], None]] = {}
    for precision in PRECISIONS:
        torch.manual_seed(0)
        model = quickstart.make_model(width)
        step = make_step(model, precision, 10**6)
        box = [step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))]

        def run(step: sbfunc.step.TrainStep = step, box: list[sbfunc.TrainState] = box) -> None:
            box[0] = step(box[0], batch)[0]

        fns[precision] = run
    return interleaved(fns, repeats, inner, warmup=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (a few seconds)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds (default 3)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs (default 8)")
    parser.add_argument("--samples", type=int, default=None, help="MNIST-1D size (5000)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--width", type=int, default=None, help="CNN width (default 128)")
    args = parser.parse_args()
    for name in ("seeds", "threads", "epochs", "samples", "width"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} must be >= 1, got {value}")
    torch.set_num_threads(args.threads)
    epochs = args.epochs or (1 if args.quick else 8)
    samples = args.samples or (700 if args.quick else 5000)
    width = args.width or (16 if args.quick else quickstart.WIDTH)  # quick: a narrow CNN
    repeats, inner = (2, 1) if args.quick else (15, 5)
    data = sbfunc.datasets.mnist1d(samples)
    rows = data.x_train.shape[0]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; quickstart CNN "
          f"(width {width}), batch {quickstart.BATCH}, {epochs} epochs on {rows} rows, "
          f"seeds 0..{args.seeds - 1}")  # fmt: skip
    for precision in PRECISIONS:
        accs = [accuracy(data, s, epochs, precision, width) for s in range(args.seeds)]
        spread = statistics.stdev(accs) if len(accs) > 1 else 0.0
        shown = " ".join(f"{a:.3f}" for a in accs)
        print(f"{precision:>9}: test accuracy {statistics.mean(accs):.3f} +- {spread:.3f} "
              f"({shown})")  # fmt: skip
    t = step_times(data, repeats, inner, width)
    ratios = [b / f for b, f in zip(t["amp_bf16"], t["fp32"], strict=True)]
    fp32, bf16 = statistics.median(t["fp32"]), statistics.median(t["amp_bf16"])
    print(f"step time: fp32 {fp32 * 1e3:.1f} ms, amp_bf16 {bf16 * 1e3:.1f} ms; amp_bf16 / fp32 "
          f"{bf16 / fp32:.2f} [{min(ratios):.2f}-{max(ratios):.2f}] over {repeats} "
          "interleaved rounds")  # fmt: skip


if __name__ == "__main__":
    main()
