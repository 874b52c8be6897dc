"""Array datasets (MNIST-1D, scikit-learn's digits), label noise and keyed minibatches.

* :func:`mnist1d` generates the MNIST-1D benchmark procedurally with
  ``mnist1d.data.make_dataset`` (needs the ``examples`` extra: ``pip install "sbfunc[examples]"``);
  the download path ``get_dataset`` is never used.
* :func:`digits` loads scikit-learn's bundled 8x8 digits (1797 images, shipped in the wheel).
* :func:`batches` cuts tensors into shuffled minibatches from an explicit key,
  :func:`dict_batches` does the same for a dict of per-row tensors.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import torch

from sbfunc import random as sbrandom
from sbfunc.batch import take
from sbfunc.validation import check_int

__all__ = ["Split", "batches", "dict_batches", "digits", "mnist1d", "with_label_noise"]


class Split(NamedTuple):
    """Train and test tensors: ``x_*`` are ``[N, 1, L]`` (mnist1d) or ``[N, 1, 8, 8]``
    (digits) float32, ``y_*`` are ``[N]`` int64 labels. It unpacks in MNIST-1D's order,
    ``x_train, y_train, x_test, y_test`` (scikit-learn's ``train_test_split`` returns
    ``X_train, X_test, y_train, y_test``, another order).

    Example:
        >>> x, y = torch.zeros(10, 1, 4), torch.arange(10) % 2
        >>> data = sbfunc.datasets.Split(x[:8], y[:8], x[8:], y[8:])
        >>> data.x_train.shape, data.y_test
        (torch.Size([8, 1, 4]), tensor([0, 1]))
        >>> x_train, y_train, x_test, y_test = data
    """

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


# The distribution providing each optional module, and the extra that lists it.
_PACKAGES = {"mnist1d": "mnist1d", "sklearn": "scikit-learn"}


def _require(module: str, extra: str = "examples") -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(_install_advice(module, extra)) from err


def _install_advice(module: str, extra: str = "examples") -> str:
    """What to install for a missing optional module (right for wheel and source installs).

    Example:
        >>> print(sbfunc.datasets._arrays._install_advice("sklearn.datasets"))
        sklearn.datasets is needed for this dataset: pip install scikit-learn (or every optional
        dependency of the examples: pip install "sbfunc[examples]", or pip install -e ".[examples]"
        from a source checkout)
    """
    package = _PACKAGES.get(module.split(".")[0], module.split(".")[0])
    return (
        f"{module} is needed for this dataset: pip install {package} (or every optional "
        f'dependency of the {extra}: pip install "sbfunc[{extra}]", or '
        f'pip install -e ".[{extra}]" from a source checkout)'
    )


def mnist1d(num_samples: int = 5000, *, seed: int = 42) -> Split:
    """MNIST-1D generated offline (80/20 train/test split as in the reference code).

    Args:
        num_samples: total samples (the published default split is 5000: 4000/1000).
        seed: the generator's seed.

    Example:
        >>> data = sbfunc.datasets.mnist1d(500)  # doctest: +SKIP
        >>> data.x_train.shape  # doctest: +SKIP
        torch.Size([400, 1, 40])

    References:
        Greydanus 2020, "Scaling down Deep Learning" (MNIST-1D).
    """
    data_mod = _require("mnist1d.data")
    args = data_mod.get_dataset_args()
    args.num_samples, args.seed = int(num_samples), int(seed)
    d = data_mod.make_dataset(args)  # procedural: pure numpy/scipy, no download

    def x(a: Any) -> torch.Tensor:
        return torch.as_tensor(a, dtype=torch.float32).unsqueeze(1)

    def y(a: Any) -> torch.Tensor:
        return torch.as_tensor(a, dtype=torch.int64)

    return Split(x(d["x"]), y(d["y"]), x(d["x_test"]), y(d["y_test"]))


def digits(*, test_fraction: float = 0.2, key: sbrandom.Key | None = None) -> Split:
    """scikit-learn's bundled 8x8 digits, scaled to [0, 1], split at random by ``key``.

    Example:
        >>> data = sbfunc.datasets.digits(key=sbfunc.random.key(0))  # doctest: +SKIP
        >>> data.x_train.shape  # doctest: +SKIP
        torch.Size([1438, 1, 8, 8])

    References:
        scikit-learn ``sklearn.datasets.load_digits``; Alpaydin and Kaynak 1998, "Optical
        Recognition of Handwritten Digits" (UCI Machine Learning Repository).
    """
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    ds = _require("sklearn.datasets").load_digits()
    x = torch.as_tensor(ds.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.as_tensor(ds.target, dtype=torch.int64)
    perm = torch.argsort(sbrandom.uniform(sbrandom.key(0) if key is None else key, (len(y),)))
    n_test = round(test_fraction * len(y))
    test, train = perm[:n_test], perm[n_test:]
    return Split(x[train], y[train], x[test], y[test])


def with_label_noise(
    y: torch.Tensor, fraction: float, num_classes: int, *, key: sbrandom.Key
) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric label noise: a ``fraction`` of labels replaced by a *different* random class.

    Returns:
        ``(noisy_labels, is_mislabelled)``.

    Example:
        >>> y = torch.zeros(1000, dtype=torch.long)
        >>> noisy, flipped = sbfunc.datasets.with_label_noise(y, 0.2, 10, key=sbfunc.random.key(0))
        >>> int(flipped.sum()), bool((noisy[flipped] != 0).all())
        (200, True)

    References:
        Han et al. 2018, "Co-teaching: Robust Training of Deep Neural Networks with Extremely
        Noisy Labels" (symmetric flipping to another class; here exactly
        ``round(fraction * N)`` labels flip).
    """
    if not 0 <= fraction <= 1:
        raise ValueError(f"fraction must be in [0, 1], got {fraction!r}")
    check_int(num_classes, "num_classes", low=2, fix="flipping a label needs another class")
    k1, k2 = sbrandom.split(key)
    n = y.shape[0]
    flip = torch.zeros(n, dtype=torch.bool, device=y.device)
    flip[torch.argsort(sbrandom.uniform(k1, (n,), device=y.device))[: round(fraction * n)]] = True
    shift = 1 + (sbrandom.uniform(k2, (n,), device=y.device) * (num_classes - 1)).long()
    noisy = torch.where(flip, (y + shift) % num_classes, y)
    return noisy, flip


def _epoch_order(
    n: int, batch_size: int, key: sbrandom.Key, drop_last: bool
) -> Iterator[torch.Tensor]:
    """The row indices of each minibatch of one shuffled epoch over ``n`` rows."""
    check_int(batch_size, "batch_size", low=1)
    perm = torch.argsort(sbrandom.uniform(key, (n,)))
    stop = n - n % batch_size if drop_last else n
    for i in range(0, stop, batch_size):
        yield perm[i : i + batch_size]


def batches(
    x: torch.Tensor, y: torch.Tensor, batch_size: int, *, key: sbrandom.Key, drop_last: bool = True
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Shuffled minibatches ``(x, y, ids)`` of one epoch, the order drawn from ``key``.

    Example:
        >>> x, y = torch.randn(10, 3), torch.arange(10)
        >>> [b[2].shape[0] for b in sbfunc.datasets.batches(x, y, 4, key=sbfunc.random.key(0))]
        [4, 4]
    """
    for ids in _epoch_order(x.shape[0], batch_size, key, drop_last):
        yield x[ids], y[ids], ids


def dict_batches(
    rows: Mapping[str, torch.Tensor],
    batch_size: int,
    *,
    key: sbrandom.Key,
    drop_last: bool = True,
) -> Iterator[dict[str, torch.Tensor]]:
    """Shuffled minibatches of one epoch of a dict of per-row tensors, the order drawn from
    ``key``: the same order as :func:`batches` draws from the same key.

    Every batch is a new dict with the same keys, each tensor's rows picked with
    :func:`sbfunc.batch.take` (for the text rows of :func:`stdlib_corpus`: ``input_ids``,
    ``attention_mask``, ``labels`` ``[B, L]``, ``ids`` and ``kind`` ``[B]``). The sample ids
    are the rows' own ``ids`` field, not positions in ``rows``.

    Args:
        rows: the dataset, every tensor with the same number of rows.
        batch_size: rows per batch, ``>= 1``.
        key: the shuffle's key (fold an epoch number in for a fresh order per epoch).
        drop_last: leave out the last, shorter batch.

    Returns:
        An iterator of dict batches.

    Raises:
        ValueError: if ``batch_size < 1`` or the tensors disagree on the number of rows.

    Example:
        >>> rows = {"input_ids": torch.zeros(10, 4, dtype=torch.long), "ids": torch.arange(10)}
        >>> got = list(sbfunc.datasets.dict_batches(rows, 4, key=sbfunc.random.key(0)))
        >>> [sorted(b) for b in got], [b["input_ids"].shape for b in got]
        ([['ids', 'input_ids'], ['ids', 'input_ids']], [torch.Size([4, 4]), torch.Size([4, 4])])

    References:
        The shuffled, drop-last epoch of PyTorch's ``DataLoader(shuffle=True, drop_last=True)``
        with dict samples collated by ``default_collate``.
    """
    n = num_rows(rows)
    for ids in _epoch_order(n, batch_size, key, drop_last):
        yield take(dict(rows), ids)


def num_rows(rows: Mapping[str, torch.Tensor]) -> int:
    """The common number of rows of ``rows``' tensors."""
    sizes = {name: int(t.shape[0]) for name, t in rows.items()}
    if not sizes or len(set(sizes.values())) != 1:
        raise ValueError(f"rows must be tensors with the same number of rows, got {sizes}")
    return next(iter(sizes.values()))
