"""What every rows dict of the text datasets satisfies."""

import torch

from sbfunc.datasets import IGNORE_INDEX, PAD_ID


def check_rows(rows, seq_len):
    """The laws of every rows dict: dtypes, shapes, right padding, labels."""
    ids, mask, labels = rows["input_ids"], rows["attention_mask"], rows["labels"]
    n = ids.shape[0]
    assert ids.shape == mask.shape == labels.shape == (n, seq_len)
    assert {t.dtype for t in rows.values()} == {torch.int64}
    assert rows["ids"].shape == rows["kind"].shape == (n,)
    real = mask == 1
    assert bool(((mask == 0) | real).all())
    assert bool((mask[:, 1:] <= mask[:, :-1]).all())  # padding only on the right
    assert bool((real.sum(1) >= 2).all())  # every row has a target after the shift
    assert torch.equal(labels == IGNORE_INDEX, ~real)
    assert torch.equal(labels[real], ids[real])  # not shifted: the loss shifts
    assert bool((ids[~real] == PAD_ID).all()) and bool((ids[real] < 256).all())
    assert bool((ids[real] >= 0).all())
