"""Token-level selection (issue 36, item 3) and references (item 4): exactly k real tokens
kept, the highest scores, the loss backpropagated over them only; a frozen reference model in
the state (never trained, checkpointed) or a table streamed with the batches, the same
selection either way; fixed shapes: fullgraph compile and the meta device."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc.selective_backprop import (
    TokenSelection,
    kept_tokens,
    reference_field,
    reference_losses,
    reference_model,
)
from tests.meta import META, all_meta, to_meta

L, V = 9, 257


@st.composite
def token_scores(draw):
    n, t = draw(st.integers(1, 5)), draw(st.integers(1, 8))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    real = torch.rand(n, t, generator=g) < draw(st.floats(0.2, 1.0))
    real[0, 0] = True
    return torch.randn(n, t, generator=g), real, draw(st.floats(0.01, 1.0))


@settings(max_examples=60, deadline=None)
@given(case=token_scores(), seed=st.integers(0, 99))
def test_exactly_k_real_tokens_are_kept_and_they_score_highest(case, seed):
    scores, real, keep = case
    kept = kept_tokens(scores, real, keep, sbfunc.random.key(seed))
    n = int(real.sum())
    k = max(1, int(n * keep))
    assert int(kept.sum()) == k and not bool((kept & ~real).any())
    lowest_kept = scores[kept].min()
    assert bool((scores[real & ~kept] <= lowest_kept).all())


def test_the_kept_count_is_pythons_floor_of_keep_times_n():
    # float32 rounds 100 * 0.29 up to 29; Python's (and the row selections') floor is 28
    scores, real = torch.randn(4, 25), torch.ones(4, 25, dtype=torch.bool)
    assert int(kept_tokens(scores, real, 0.29, sbfunc.random.key(0)).sum()) == int(100 * 0.29)
    schedule = torch.tensor(0.29)  # a schedule's value, a float32 tensor
    assert int(kept_tokens(scores, real, schedule, sbfunc.random.key(0)).sum()) == 28


def test_ties_are_broken_by_the_key_and_reproducibly():
    scores, real = torch.zeros(2, 6), torch.ones(2, 6, dtype=torch.bool)
    draws = [kept_tokens(scores, real, 0.5, sbfunc.random.key(s)) for s in range(4)]
    assert torch.equal(draws[0], kept_tokens(scores, real, 0.5, sbfunc.random.key(0)))
    assert len({tuple(d.reshape(-1).tolist()) for d in draws}) > 1


def _rows(seed=0, n=16):
    corpus = sbfunc.datasets.stdlib_corpus(seq_len=L, max_bytes=4_000)
    rows = {k: v[:n] for k, v in corpus.rows.items() if k != "kind"}
    return rows


def _lm(seed=0):
    return sbfunc.models.CausalLM(
        d_model=16, num_heads=2, num_layers=1, max_len=L, key=sbfunc.random.key(seed)
    )


def _loss(model):
    return sbfunc.per_sample_loss(
        model, sbfunc.module.next_token_cross_entropy, input=("input_ids", "attention_mask"),
        target="labels",
    )  # fmt: skip


def _step(selection, *, compile=False):
    model = _lm()
    step = sbfunc.make_train_step(_loss(model), sbfunc.optim.sgd(0.5), [selection])
    if compile:
        step.compile(backend="eager", fullgraph=True)
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(1))
    return model, step, state


def test_the_loss_backpropagated_is_the_mean_over_the_kept_tokens_only():
    sel = TokenSelection(0.3, score="loss")
    model, step, state = _step(sel)
    batch = _rows()
    _, metrics = step(state, batch)
    tokens = _loss(model).elements(
        torch.func.functional_call(
            model, state.params, (batch["input_ids"], batch["attention_mask"])
        ),
        batch,
    )
    k = max(1, int(int(tokens.mask.sum()) * 0.3))
    top = torch.topk(torch.where(tokens.mask, tokens.losses, -torch.inf).reshape(-1), k).values
    torch.testing.assert_close(metrics.loss, top.mean(), rtol=1e-5, atol=1e-6)


def test_a_reference_in_the_state_is_never_trained_and_round_trips_a_checkpoint(tmp_path):
    ref = _lm(seed=5)
    reference = reference_model(_loss(ref), *sbfunc.split_module(ref))
    model, step, state = _step(TokenSelection(0.5, reference=reference))
    before = {k: v.clone() for k, v in state.algorithm_state[0].params.items()}
    for seed in range(3):
        state, _ = step(state, _rows(seed))
    assert all(torch.equal(state.algorithm_state[0].params[k], v) for k, v in before.items())
    sbfunc.checkpoint.save(state, tmp_path / "run.pt")
    fresh = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(1))
    loaded = sbfunc.checkpoint.load(tmp_path / "run.pt", like=fresh)
    assert all(torch.equal(loaded.algorithm_state[0].params[k], v) for k, v in before.items())
    a, _ = step(state, _rows(7))
    b, _ = step(loaded, _rows(7))
    assert all(torch.equal(a.params[k], b.params[k]) for k in a.params)


def test_a_streamed_table_selects_what_the_reference_in_the_step_selects():
    ref = _lm(seed=5)
    ref_loss, (p, b) = _loss(ref), sbfunc.split_module(ref)
    rows = _rows()
    table = reference_losses(ref_loss, p, b, rows)
    assert table.shape == rows["input_ids"].shape
    in_step = _step(TokenSelection(0.5, reference=reference_model(ref_loss, p, b)))
    streamed = _step(TokenSelection(0.5, reference=reference_field()))
    a, ma = in_step[1](in_step[2], rows)
    b_, mb = streamed[1](streamed[2], {**rows, "reference_losses": table})
    torch.testing.assert_close(ma.loss, mb.loss)
    assert all(torch.allclose(a.params[k], b_.params[k]) for k in a.params)


def test_uniform_dropping_keeps_the_fraction_whatever_the_losses():
    _, step, state = _step(TokenSelection(0.25, score="uniform"))
    _, metrics = step(state, _rows())
    assert torch.isfinite(metrics.loss)


def test_a_keep_schedule_reads_the_fraction_of_training_done():
    seen = []

    def keep(elapsed):
        seen.append(float(elapsed))
        return torch.clamp(1.0 - elapsed, min=0.2)

    model = _lm()
    step = sbfunc.make_train_step(
        _loss(model), sbfunc.optim.sgd(0.1), [TokenSelection(keep, score="loss")]
    )
    state = step.init(
        *sbfunc.split_module(model, clone=True), key=sbfunc.random.key(1), total_steps=4
    )
    for _ in range(4):
        state, _ = step(state, _rows())
    assert seen == [0.0, 0.25, 0.5, 0.75]


def test_the_arguments_and_the_loss_are_checked():
    with pytest.raises(ValueError, match="score='excess' needs a reference"):
        TokenSelection(0.5)
    with pytest.raises(ValueError, match="keep must be"):
        TokenSelection(0.0, score="loss")
    linear = torch.nn.Linear(3, 2)
    loss_fn = sbfunc.per_sample_loss(linear, torch.nn.functional.cross_entropy)
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1), [TokenSelection(score="loss")])
    state = step.init(*sbfunc.split_module(linear), key=sbfunc.random.key(0))
    with pytest.raises(ValueError, match="loss must be over tokens"):
        step(state, (torch.randn(4, 3), torch.randint(0, 2, (4,))))


@pytest.mark.parametrize("score", ["excess", "loss", "uniform"])
def test_token_selection_compiles_fullgraph(score):
    ref = _lm(seed=5)
    reference = reference_model(_loss(ref), *sbfunc.split_module(ref))
    rows = _rows()
    eager = _step(TokenSelection(0.5, reference=reference, score=score))
    compiled = _step(TokenSelection(0.5, reference=reference, score=score), compile=True)
    _, ma = eager[1](eager[2], rows)
    _, mb = compiled[1](compiled[2], rows)
    torch.testing.assert_close(ma.loss, mb.loss)


def test_token_selection_reads_nothing_on_the_host():
    ref = _lm(seed=5)
    reference = reference_model(_loss(ref), *sbfunc.split_module(ref))
    _, step, state = _step(TokenSelection(0.5, reference=reference))
    state = to_meta(state)
    rows = {k: v.to(META) for k, v in _rows().items()}
    new, metrics = step(state, rows)
    assert all_meta(new.params) and metrics.loss.device == META


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(case=token_scores(), seed=st.integers(0, 99))
def test_the_eager_path_without_noise_keeps_what_the_noise_would(case, seed):
    """Eagerly on the CPU, distinct real scores are ordered without drawing the tie noise (the
    tokens that are not real tie at -inf, lowest, never kept): the kept tokens are the noise
    path's, bit for bit."""
    scores, real, keep = case
    key = sbfunc.random.key(seed)
    flat = torch.where(real, scores, -torch.inf).reshape(-1)
    order = sbfunc.select.ascending_order(flat, sbfunc.random.bits(key, flat.shape))
    rank = torch.empty_like(order)
    rank[order] = torch.arange(flat.shape[0])
    k = max(1, int(int(real.sum()) * keep))
    noisy = ((flat.shape[0] - 1 - rank < k) & real.reshape(-1)).reshape(real.shape)
    assert torch.equal(kept_tokens(scores, real, keep, key), noisy)
