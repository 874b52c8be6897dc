import pytest
import torch

import sbfunc
from sbfunc import random as sbrandom


def test_batches_cover_every_row_once_per_epoch():
    x, y = torch.arange(10.0)[:, None], torch.arange(10)
    got = [b for b in sbfunc.datasets.batches(x, y, 3, key=sbrandom.key(0), drop_last=False)]
    ids = torch.cat([b[2] for b in got])
    assert sorted(ids.tolist()) == list(range(10))
    assert all(torch.equal(b[1], b[2]) for b in got)  # ids index the rows


@pytest.mark.parametrize(
    ("bs", "error"), [(0, ValueError), (-1, ValueError), (2.0, TypeError), (True, TypeError)]
)
def test_batches_validates_batch_size(bs, error):
    with pytest.raises(error, match="batch_size must be an int >= 1"):
        list(sbfunc.datasets.batches(torch.ones(4, 1), torch.ones(4), bs, key=sbrandom.key(0)))


def test_label_noise_flips_to_a_different_class():
    y = torch.arange(100) % 10
    noisy, flipped = sbfunc.datasets.with_label_noise(y, 0.3, 10, key=sbrandom.key(1))
    assert int(flipped.sum()) == 30
    assert bool((noisy[flipped] != y[flipped]).all()) and torch.equal(noisy[~flipped], y[~flipped])


@pytest.mark.parametrize(
    ("kwargs", "msg"), [({"fraction": 1.5}, "fraction"), ({"num_classes": 1}, "num_classes")]
)
def test_label_noise_validation(kwargs, msg):
    args = {"fraction": 0.1, "num_classes": 3, **kwargs}
    with pytest.raises(ValueError, match=msg):
        sbfunc.datasets.with_label_noise(
            torch.zeros(4, dtype=torch.long), key=sbrandom.key(0), **args
        )


def test_digits_validates_test_fraction():
    with pytest.raises(ValueError, match="test_fraction"):
        sbfunc.datasets.digits(test_fraction=1.0)


def test_missing_dependency_advice_fits_any_install(monkeypatch):
    monkeypatch.setattr(sbfunc.datasets._arrays.importlib, "import_module", _fail)
    with pytest.raises(ImportError, match="pip install scikit-learn") as info:
        sbfunc.datasets.digits()
    msg = str(info.value)
    assert 'pip install "sbfunc[examples]"' in msg  # a wheel install has no source tree
    assert "pip install mnist1d" in sbfunc.datasets._arrays._install_advice("mnist1d.data")


def _fail(name):
    raise ImportError(f"No module named {name!r}")
