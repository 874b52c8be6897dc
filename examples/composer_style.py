"""Composer-style imperative training: nn.Module + torch.optim + sbfunc.compat.select_using_loss.

Plain PyTorch users keep their loop; the one-line change is pruning each batch with
``sbfunc.compat.select_using_loss`` (Composer's signature, with an explicit
``torch.Generator``) when ``sbfunc.selective_backprop.should_selective_backprop`` (Composer's
schedule) says so. Trains a small CNN on scikit-learn's bundled digits, plain vs selective
backprop, and prints accuracy and backpropagated samples.

Run: ``python examples/composer_style.py`` (``--fast`` for a smoke run).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

import sbfunc


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(128, 10),
    )


def train(selective: bool, epochs: int, data: sbfunc.datasets.Split) -> tuple[float, int]:
    torch.manual_seed(0)  # the model's initialisation, identical for both runs
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)  # selection randomness, explicit
    steps_per_epoch = data.x_train.shape[0] // 64
    # The loop's clock: given the run's length, Time.advanced moves `elapsed` (the fraction of
    # training done, Composer's elapsed duration) with every batch.
    time = sbfunc.Time(total_steps=epochs * steps_per_epoch)
    for epoch in range(epochs):
        key = sbfunc.random.fold_in(sbfunc.random.key(1), epoch)
        time = time._replace(epoch=epoch, batch_in_epoch=0)
        for x, y, _ in sbfunc.datasets.batches(data.x_train, data.y_train, 64, key=key):
            scored = 0
            if selective and sbfunc.selective_backprop.should_selective_backprop(
                time.elapsed, time.batch_in_epoch, 0.3, 0.95, 2
            ):
                scored = x.shape[0]
                x, y = sbfunc.compat.select_using_loss(
                    x, y, model, F.cross_entropy, keep=0.5, scale_factor=0.5, generator=gen
                )
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            time = time.advanced(forwarded=scored + x.shape[0], backpropagated=x.shape[0])
    model.eval()
    with torch.no_grad():
        acc = (model(data.x_test).argmax(1) == data.y_test).float().mean()
    return float(acc), time.samples_backpropagated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="one epoch (smoke run)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    data = sbfunc.datasets.digits(key=sbfunc.random.key(0))
    epochs = 1 if args.fast else 8
    print(f"{'run':<20}{'test acc':>10}{'backpropagated':>16}")
    for name, selective in (("plain", False), ("selective backprop", True)):
        acc, bwd = train(selective, epochs, data)
        print(f"{name:<20}{acc:>10.3f}{bwd:>16d}")


if __name__ == "__main__":
    main()
