import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import sbfunc
from sbfunc.algorithms._seq_length_warmup import (
    SeqLengthWarmup,
    set_batch_sequence_length,
    warmup_sequence_length,
)
from sbfunc.engine import DEFAULT_PASSES
from sbfunc.testing import algorithm_lists, events

common = settings(max_examples=40, deadline=None, derandomize=True, database=None)
E = sbfunc.Event


def _batch(n, length, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 50, (n, length), generator=g)
    real = torch.randint(1, length + 1, (n,), generator=g)
    mask = (torch.arange(length)[None] < real[:, None]).long()
    return {"input_ids": ids * mask, "attention_mask": mask, "label": torch.arange(n)}


@common
@given(st.integers(1, 5), st.integers(2, 12), st.integers(1, 14), st.booleans())
def test_truncation(n, length, new, preserve):
    batch = _batch(n, length)
    before = {k: v.clone() for k, v in batch.items()}
    out = set_batch_sequence_length(batch, new, preserve_end_of_sequence=preserve)
    assert all(torch.equal(batch[k], before[k]) for k in batch)  # pure
    cut = min(new, length)
    assert out["input_ids"].shape == (n, cut) and out["attention_mask"].shape == (n, cut)
    assert torch.equal(out["label"], batch["label"])  # rank-1 leaves are left alone
    last = batch["attention_mask"].sum(1) - 1
    for r in range(n):
        if preserve and last[r] >= cut:  # the end of sequence moves into the last kept slot
            assert out["input_ids"][r, -1] == batch["input_ids"][r, last[r]]
            assert torch.equal(out["input_ids"][r, :-1], batch["input_ids"][r, : cut - 1])
        else:
            assert torch.equal(out["input_ids"][r], batch["input_ids"][r, :cut])


@common
@given(st.integers(1, 5), st.integers(2, 12), st.integers(1, 14))
def test_reshape_keeps_the_tokens_in_more_rows(n, length, new):
    batch = {"input_ids": torch.arange(n * length).view(n, length)}
    out = set_batch_sequence_length(batch, new, truncate=False)["input_ids"]
    if new >= length:
        assert out is batch["input_ids"]
        return
    kept = (n * length // new) * new
    assert out.shape == (kept // new, new)
    assert torch.equal(out.flatten(), torch.arange(kept))


def test_reshape_needs_one_shape():
    with pytest.raises(ValueError, match="all must have the shape"):
        set_batch_sequence_length(_batch(2, 6), 3, truncate=False)


@common
@given(
    st.floats(0.0, 1.0),
    st.floats(0.0, 1.0),
    st.floats(0.0, 1.0),
    st.integers(1, 64),
    st.integers(0, 200),
    st.integers(1, 16),
)
def test_warmup_schedule(t1, t2, duration, low, extra, step):
    kw = {"duration": duration, "min_seq_length": low, "max_seq_length": low + extra}
    a, b = sorted((t1, t2))
    la = warmup_sequence_length(a, step_size=step, **kw)
    lb = warmup_sequence_length(b, step_size=step, **kw)
    assert low <= la <= lb <= low + extra  # monotone, within [min, max]
    assert (la - low) % step == 0 or la == low + extra
    assert warmup_sequence_length(0.0, step_size=step, **kw) == (
        low if duration > 0 else low + extra
    )
    assert warmup_sequence_length(max(duration, 1e-9), step_size=step, **kw) == low + extra


def test_algorithm_decides_on_the_host_and_truncates():
    warmup = SeqLengthWarmup(duration=0.5, min_seq_length=4, max_seq_length=16, step_size=4)
    state = sbfunc.Context(sbfunc.random.key(0), batch=_batch(3, 16))
    decisions = [
        warmup.match(E.AFTER_DATALOADER, state.replace(time=sbfunc.Time(elapsed=t)))
        for t in (0.0, 0.2, 0.4, 0.5, 0.9)
    ]
    # match decides from the time alone (the target length); apply leaves shorter rows alone
    assert decisions == [4, 8, 12, 16, 16]
    assert warmup.apply(E.AFTER_DATALOADER, state.replace(matched=16)) == state.replace(matched=16)
    assert not warmup.match(E.BEFORE_FORWARD, state)
    out = warmup.apply(E.AFTER_DATALOADER, state.replace(matched=8)).batch
    assert out["input_ids"].shape == (3, 8)
    long = sbfunc.Context(sbfunc.random.key(0), batch=_batch(2, 20), time=sbfunc.Time(elapsed=1.0))
    assert warmup.match(E.AFTER_DATALOADER, long) == 16  # cut to max after the warm-up


@pytest.mark.filterwarnings("ignore::sbfunc.engine.MultipleLossInterpolationWarning")
@common
@given(algorithm_lists(), events(), st.integers(0, 3), st.randoms(use_true_random=False))
def test_pass_puts_sequence_length_first_before_sample_selection(algs, event, k, rng):
    warmups = [SeqLengthWarmup() for _ in range(k)]
    for w in warmups:
        algs.insert(rng.randint(0, len(algs)), w)
    out = list(algs)
    for p in sbfunc.engine.DEFAULT_PASSES:
        out = p(out, event)
    default = [a for a in algs if not a.changes_sequence_length]
    for p in DEFAULT_PASSES:
        default = p(default, event)
    assert sorted(map(id, out)) == sorted(map(id, algs))  # a permutation
    listed = [id(a) for a in algs if a.changes_sequence_length]  # warmups and flagged toys
    assert sorted(id(a) for a in out[: len(listed)]) == sorted(listed)  # first, as a group
    assert [id(a) for a in out[: len(listed)]] == listed  # in list order
    assert [id(a) for a in out[len(listed) :]] == [id(a) for a in default]  # others as by default


def test_selective_backprop_scores_the_warmed_up_rows():
    class Pool(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.out = nn.Embedding(50, 8), nn.Linear(8, 3)

        def forward(self, ids):
            return self.out(self.emb(ids).mean(1))

    torch.manual_seed(0)
    model = Pool()
    seen = []
    inner = sbfunc.per_sample_loss(model, F.cross_entropy, input="input_ids", target="label")

    def score(params, buffers, batch):
        seen.append(tuple(batch["input_ids"].shape))
        return inner(params, buffers, batch)

    sb = sbfunc.SelectiveBackprop(
        0.0, 1.0, 0.5, interrupt=0, scoring=sbfunc.score.Scoring(loss_fn=score)
    )
    warmup = SeqLengthWarmup(duration=1.0, min_seq_length=4, max_seq_length=16, step_size=4)
    train = sbfunc.per_sample_loss(
        model, F.cross_entropy, input="input_ids", target="label", mode="train"
    )
    batch = _batch(8, 16)
    batch["label"] = batch["label"] % 3
    sb_first = (sbfunc.engine.sort_selective_backprop_first,)  # SB before the warm-up
    for passes, expected in ((DEFAULT_PASSES, (8, 4)), (sb_first, (8, 16))):
        seen.clear()
        step = sbfunc.make_train_step(train, sbfunc.optim.sgd(0.1), [warmup, sb], passes)
        state = step.init(
            *sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0), total_steps=10
        )
        _, metrics = step(state, batch)
        assert seen == [expected]  # with the pass, SB scores the rows at their trained length
        assert metrics.samples_backpropagated == 4


@pytest.mark.parametrize(
    ("kwargs", "exc", "msg"),
    [
        ({"duration": 1.5}, ValueError, "duration"),
        ({"min_seq_length": 0}, ValueError, "min_seq_length must be an int >= 1"),
        ({"min_seq_length": 9, "max_seq_length": 8}, ValueError, "max_seq_length"),
        ({"step_size": 0}, ValueError, "step_size"),
        ({"truncate": 1}, TypeError, "truncate must be True or False"),
    ],
)
def test_errors(kwargs, exc, msg):
    with pytest.raises(exc, match=msg):
        SeqLengthWarmup(**kwargs)
