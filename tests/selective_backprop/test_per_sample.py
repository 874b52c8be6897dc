"""Mixed real-world batches through Selective Backprop and the step with a ``per_sample`` spec:
a ``[C]`` class-weight tensor with ``C == N`` (metadata), lists of strings, tuples of ids, NumPy
arrays and a namedtuple of them stay aligned through scoring (also on a subset), pruning, the
refill queue across steps, and the step's row counts."""

from collections import namedtuple

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc import random as sbrandom
from sbfunc.types import ROWS
from tests.helpers import split

common = settings(max_examples=25, deadline=None, derandomize=True, database=None)

Extra = namedtuple("Extra", ["names", "codes"])
SPEC = {"class_weight": False}
OPTIONAL = ("name", "tag_ids", "arr", "extra", "meta")


def mixed_batch(ids, classes, fields=OPTIONAL):
    """A dict batch whose every per-sample field is a function of the row's id."""
    t = torch.tensor(ids, dtype=torch.int64)
    batch = {
        "x": torch.stack([t.float(), (t % 5).float(), (t * 7 % 3).float(), -t.float()], 1),
        "y": t % classes,
        "id": t,
        "class_weight": torch.linspace(0.5, 2.0, classes),  # [C], C == N: not per-sample
    }
    if "name" in fields:
        batch["name"] = [f"row{i}" for i in ids]  # default_collate's list of strings
    if "tag_ids" in fields:
        batch["tag_ids"] = tuple(ids)  # zip(*samples)'s tuple of ids
    if "arr" in fields:
        batch["arr"] = np.array([[i, -i] for i in ids], dtype=np.int64)
    if "extra" in fields:
        batch["extra"] = Extra([f"e{i}" for i in ids], np.array(ids, dtype=np.int64) * 3)
    if "meta" in fields:
        batch["meta"] = {"split": "train", "scale": torch.tensor(1.0)}
    return batch


def check_aligned(batch, classes):
    """Every field of every row agrees with the row's id; the metadata is untouched."""
    ids = batch["id"].tolist()
    assert batch["x"][:, 0].long().tolist() == ids
    assert batch["y"].tolist() == [i % classes for i in ids]
    assert torch.equal(batch["class_weight"], torch.linspace(0.5, 2.0, classes))
    if "name" in batch:
        assert batch["name"] == [f"row{i}" for i in ids]
    if "tag_ids" in batch:
        assert type(batch["tag_ids"]) is tuple and batch["tag_ids"] == tuple(ids)
    if "arr" in batch:
        assert batch["arr"].shape == (len(ids), 2) and batch["arr"][:, 0].tolist() == ids
    if "extra" in batch:
        assert isinstance(batch["extra"], Extra) and batch["extra"].names == [f"e{i}" for i in ids]
        assert batch["extra"].codes.tolist() == [3 * i for i in ids]
    if "meta" in batch:
        assert batch["meta"]["split"] == "train" and float(batch["meta"]["scale"]) == 1.0


class Spy(sbfunc.Algorithm):
    """Records the ids of the rows every update trains on (``BEFORE_LOSS``)."""

    def __init__(self, classes, trained):
        self.classes, self.trained = classes, trained

    def match(self, event, state):
        return event == sbfunc.Event.BEFORE_LOSS

    def apply(self, event, state):
        check_aligned(state.batch, self.classes)
        self.trained.append(state.batch["id"].tolist())
        return state


def make_run(classes, sb_kwargs, *, spec=SPEC, **step_kwargs):
    """A linear classifier of ``classes`` classes whose loss reads the class weights and checks
    every batch it sees (scoring and training) for alignment; SB with ``sb_kwargs``."""
    scored = []

    def loss_fn(params, buffers, batch):
        check_aligned(batch, classes)
        if not torch.is_grad_enabled():  # the scoring forward runs under no_grad
            scored.append(batch["id"].tolist())
        logits = batch["x"] @ params["w"].T + params["b"]
        weight = batch["class_weight"]
        return F.cross_entropy(logits, batch["y"], weight=weight, reduction="none")

    trained = []
    sb = sbfunc.SelectiveBackprop(0.0, 1.0, interrupt=0, per_sample=spec, **sb_kwargs)
    step = sbfunc.make_train_step(
        loss_fn,
        sbfunc.optim.sgd(0.1),
        [sb, Spy(classes, trained)],
        per_sample=spec,
        microbatching=split(size=step_kwargs.pop("microbatch_size", None)),
        **step_kwargs,
    )
    g = torch.Generator().manual_seed(classes)
    params = {"w": torch.randn(classes, 4, generator=g) * 0.1, "b": torch.zeros(classes)}
    state = step.init(params, {}, key=sbrandom.key(classes))
    return step, state, trained, scored


fields_st = st.sets(st.sampled_from(OPTIONAL)).map(lambda s: tuple(sorted(s)))


def explicit_spec(fields):
    """A spec that also marks some per-sample leaves explicitly (same meaning as ``SPEC``)."""
    return {
        "class_weight": False,
        "id": True,
        **({"tag_ids": ROWS} if "tag_ids" in fields else {}),
    }


@common
@given(
    n=st.integers(2, 8),
    keep=st.sampled_from([0.25, 0.5, 0.75]),
    steps=st.integers(1, 3),
    fields=fields_st,
    explicit=st.booleans(),
)
def test_rank_power_keeps_every_field_aligned_through_the_step(n, keep, steps, fields, explicit):
    spec = explicit_spec(fields) if explicit else SPEC
    step, state, trained, scored = make_run(n, {"keep": keep}, spec=spec)
    k = sbfunc.select.kept_count(n, keep)
    for i in range(steps):
        ids = [100 * i + j for j in range(n)]
        state, metrics = step(state, mixed_batch(ids, n, fields))
        assert (metrics.samples_in_batch, metrics.samples_backpropagated) == (n, k)
        assert not bool(metrics.skipped) and torch.isfinite(metrics.loss)
        assert scored[-1] == ids  # the whole batch scored
        assert len(set(trained[-1])) == k and set(trained[-1]) <= set(ids)
    assert state.time.samples_forwarded == steps * (n + k)
    assert state.time.samples_backpropagated == steps * k


@common
@given(n=st.integers(4, 8), size=st.integers(1, 3), fields=fields_st)
def test_microbatches_take_the_kept_rows_with_the_spec(n, size, fields):
    step, state, trained, _ = make_run(n, {"keep": 0.5}, microbatch_size=size)
    k = sbfunc.select.kept_count(n, 0.5)
    ids = list(range(n))
    state, metrics = step(state, mixed_batch(ids, n, fields))
    assert metrics.samples_backpropagated == k and torch.isfinite(metrics.loss)
    chunks = trained[-len(range(0, k, size)) :]  # Spy checked every chunk's alignment
    assert [len(c) for c in chunks] == [min(size, k - s) for s in range(0, k, size)]
    assert len({i for c in chunks for i in c}) == k


@common
@given(n=st.integers(2, 8), steps=st.integers(2, 4), fields=fields_st)
def test_stale_sb_scores_a_subset_of_a_mixed_batch(n, steps, fields):
    policy = sbfunc.policies.stale_sb(1.0, num_ids=4 * n, max_age=2)
    step, state, trained, scored = make_run(n, {"policy": policy, "ids": "id"})
    seen = set()
    for i in range(steps):
        ids = [(i * n // 2 + j) % (2 * n) for j in range(n)]  # consecutive batches overlap
        state, metrics = step(state, mixed_batch(ids, n, fields))
        fresh = [j for j in ids if j not in seen]
        assert (scored[-1] if fresh else []) == fresh  # only the rows never seen are scored
        seen.update(ids)
        assert metrics.samples_backpropagated == len(trained[-1]) >= 1


@common
@given(
    n=st.integers(2, 6),
    b=st.integers(1, 10),
    steps=st.integers(1, 6),
    fields=fields_st,
    variable=st.booleans(),
)
def test_refill_queue_keeps_every_field_aligned_across_steps(n, b, steps, fields, variable):
    policy = sbfunc.policies.jiang_cdf(1.0) if variable else sbfunc.policies.top_k(0.5)
    refill = mixed_batch(list(range(1000, 1000 + b)), n, fields)  # b rows, C = n classes
    step, state, trained, _ = make_run(n, {"policy": policy, "ids": "id", "refill": refill})
    for i in range(steps):
        state, metrics = step(state, mixed_batch([100 * i + j for j in range(n)], n, fields))
        assert metrics.samples_backpropagated in (0, b)
        assert bool(metrics.skipped) == (metrics.samples_backpropagated == 0)
    _, queue = state.algorithm_state[0]
    queued = queue.rows["id"].tolist()
    check_aligned(queue.rows, n)
    assert sbfunc.batch.batch_size(queue.rows, per_sample=SPEC) == len(queued)  # one batch a step
    assert all(len(ids) == b for ids in trained)
    flat = [i for ids in trained for i in ids] + queued
    assert len(flat) == len(set(flat))  # never dropped or duplicated
    assert [i // 100 for i in flat] == sorted(i // 100 for i in flat)  # FIFO across steps
    if not variable:  # top-k keeps floor(n / 2) of every batch
        assert len(flat) == steps * sbfunc.select.kept_count(n, 0.5)


def test_without_the_spec_a_class_weight_with_c_equal_n_is_pruned():
    batch = mixed_batch([0, 1, 2, 3], 4)
    assert sbfunc.batch.take(batch, torch.tensor([1]))["class_weight"].shape == (1,)
    kept = sbfunc.batch.take(batch, torch.tensor([3, 1]), per_sample=SPEC)
    check_aligned(kept, 4)


def test_the_step_and_the_algorithm_must_agree_on_the_spec():
    sb = sbfunc.SelectiveBackprop(per_sample=SPEC)
    opt = sbfunc.optim.sgd(0.1)
    with pytest.raises(ValueError, match=r"per_sample=\{'class_weight': False\}, but the step"):
        sbfunc.make_train_step(lambda p, b, x: x, opt, [sb])
    step = sbfunc.make_train_step(lambda p, b, x: x, opt, [sbfunc.sequence(sb)], per_sample=SPEC)
    assert step.per_sample == SPEC
    plain = sbfunc.SelectiveBackprop()  # no spec of its own: it takes the step's (for_step)
    step = sbfunc.make_train_step(
        lambda p, b, x: x, opt, [sbfunc.sequence(plain)], per_sample=SPEC
    )
    assert step.algorithms[0].parts[0].per_sample == SPEC and plain.per_sample is None
    with pytest.raises(TypeError, match="per_sample"):
        sbfunc.make_train_step(lambda p, b, x: x, opt, per_sample={"x": 1})


def test_spec_is_validated_at_construction():
    with pytest.raises(TypeError, match=r"per_sample\['w'\]"):
        sbfunc.SelectiveBackprop(per_sample={"w": "no"})
    with pytest.raises(ValueError, match="disagree"):  # the refill example is checked too
        sbfunc.SelectiveBackprop(
            policy=sbfunc.policies.top_k(0.5), refill=mixed_batch([0, 1, 2], 4)
        )
