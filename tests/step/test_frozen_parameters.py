"""Frozen parameters stay frozen (issue 40, item 1).

``requires_grad_(False)`` on part of a model (a frozen base, LoRA's frozen weights, partial
fine-tuning) must leave those tensors bit for bit unchanged through every step: every
optimizer (weight decay included), Selective Backprop and token selection, eager and compiled,
``fit`` and its checkpoints; and their gradients are never computed. In 1.1, ``split_module``
returned them as trainable and one ``adamw`` step changed all of them.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import sbfunc
from sbfunc.selective_backprop import TokenSelection
from tests.helpers import lm_loss, tiny_lm

L = 9
OPTIMIZERS = {
    "sgd_momentum_decay": lambda: sbfunc.optim.sgd(0.1, momentum=0.9, weight_decay=0.1),
    "adam": lambda: sbfunc.optim.adam(1e-2),
    "adamw": lambda: sbfunc.optim.adamw(1e-2, weight_decay=0.1),
    "decoupled_adamw": lambda: sbfunc.optim.decoupled_adamw(1e-2, weight_decay=0.1),
    "accumulated_adamw": lambda: sbfunc.optim.multi_steps(sbfunc.optim.adamw(1e-2), 2),
}
ALGORITHMS = {
    "plain": lambda: [],
    "selective_backprop": lambda: [sbfunc.SelectiveBackprop(0.0, 1.0, keep=0.5, interrupt=0)],
    "token_selection": lambda: [TokenSelection(0.5, score="loss")],
}


def _rows(n: int = 8) -> dict[str, torch.Tensor]:
    corpus = sbfunc.datasets.stdlib_corpus(seq_len=L, max_bytes=4_000)
    return {k: v[:n] for k, v in corpus.rows.items() if k != "kind"}


def _lm() -> sbfunc.models.CausalLM:
    return tiny_lm(L, layers=2)


_lm_loss = lm_loss


def _frozen_lm(frozen: set[str]) -> sbfunc.models.CausalLM:
    model = _lm()
    for name, p in model.named_parameters():
        p.requires_grad_(name not in frozen)
    return model


def _assert_frozen(before: sbfunc.TrainState, after: sbfunc.TrainState, names: set[str]):
    for name in names:
        assert torch.equal(before.buffers[name], after.buffers[name]), name
        assert before.buffers[name].dtype == after.buffers[name].dtype


NAMES = [name for name, _ in _lm().named_parameters()]


def test_split_module_puts_frozen_parameters_with_the_buffers():
    model = _frozen_lm({NAMES[0], NAMES[3]})
    params, buffers = sbfunc.split_module(model)
    assert set(params) == set(NAMES) - {NAMES[0], NAMES[3]}
    assert {NAMES[0], NAMES[3]} <= set(buffers)
    assert not any(t.requires_grad for t in (*params.values(), *buffers.values()))


@settings(max_examples=12, deadline=None, derandomize=True, database=None)
@given(
    frozen=st.sets(st.sampled_from(NAMES), min_size=1, max_size=len(NAMES) - 1),
    optimizer=st.sampled_from(sorted(OPTIMIZERS)),
    algorithm=st.sampled_from(sorted(ALGORITHMS)),
)
def test_frozen_tensors_never_change(frozen, optimizer, algorithm):
    model = _frozen_lm(frozen)
    step = sbfunc.make_train_step(
        _lm_loss(model), OPTIMIZERS[optimizer](), ALGORITHMS[algorithm]()
    )
    state = step.init(
        *sbfunc.split_module(model, clone=True), key=sbfunc.random.key(1), total_steps=4
    )
    after = state
    for _ in range(3):
        after, metrics = step(after, _rows())
    assert bool(torch.isfinite(metrics.loss))
    _assert_frozen(state, after, frozen)
    trained = set(NAMES) - frozen
    assert set(after.params) == trained
    assert any(not torch.equal(state.params[k], after.params[k]) for k in trained)


@pytest.mark.slow
def test_a_compiled_step_keeps_them_frozen_and_matches_eager():
    frozen = {n for n in NAMES if not n.startswith("blocks.1.")}
    model = _frozen_lm(frozen)
    loss_fn = _lm_loss(model)
    eager = sbfunc.make_train_step(loss_fn, OPTIMIZERS["adamw"](), ALGORITHMS["token_selection"]())
    compiled = sbfunc.make_train_step(
        loss_fn, OPTIMIZERS["adamw"](), ALGORITHMS["token_selection"]()
    )
    compiled.compile(backend="aot_eager", fullgraph=True)
    init = sbfunc.split_module(model, clone=True)
    a = eager.init(*init, key=sbfunc.random.key(1), total_steps=4)
    b = compiled.init(*init, key=sbfunc.random.key(1), total_steps=4)
    for _ in range(2):
        a, _ = eager(a, _rows())
        b, _ = compiled(b, _rows())
    _assert_frozen(eager.init(*init, key=sbfunc.random.key(1)), b, frozen)
    for k in a.params:
        torch.testing.assert_close(a.params[k], b.params[k], rtol=1e-5, atol=1e-6)


def test_fit_and_its_checkpoints_keep_them_frozen(tmp_path):
    frozen = {NAMES[0], NAMES[1]}
    model = _frozen_lm(frozen)
    step = sbfunc.make_train_step(_lm_loss(model), OPTIMIZERS["adamw"]())
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(1))
    path = str(tmp_path / "ckpt-{epoch}.pt")
    result = sbfunc.fit(
        step, state, [_rows(), _rows()], epochs=2, progress=False,
        checkpointing=sbfunc.step.Checkpointing(path, every=sbfunc.engine.Duration(epochs=1)),
    )  # fmt: skip
    _assert_frozen(state, result.state, frozen)
    loaded = sbfunc.checkpoint.load(path.format(epoch=2), like=state)
    _assert_frozen(state, loaded, frozen)


class _Ops(TorchDispatchMode):
    """Counts the aten operators dispatched under it, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))


def _matmuls(freeze_first: bool) -> int:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    model[0].requires_grad_(not freeze_first)
    step = sbfunc.make_train_step(sbfunc.per_sample_loss(model, F.cross_entropy),
                                  sbfunc.optim.sgd(0.1))  # fmt: skip
    state = step.init(*sbfunc.split_module(model), key=sbfunc.random.key(0))
    batch = (torch.randn(16, 32), torch.randint(0, 4, (16,)))
    with _Ops() as ops:
        step(state, batch)
    return sum(name.startswith(("mm", "addmm")) for name in ops.names)


def test_the_gradients_of_frozen_parameters_are_never_computed():
    # trainable: 2 forward matmuls, 3 backward (each weight's gradient, one input gradient);
    # the first layer frozen: neither its weight's gradient nor its input's is computed
    assert _matmuls(freeze_first=False) == 5
    assert _matmuls(freeze_first=True) == 3


def test_a_frozen_parameter_given_as_trainable_is_refused():
    model = _frozen_lm({NAMES[0]})
    step = sbfunc.make_train_step(_lm_loss(model), OPTIMIZERS["adamw"]())
    params = {k: v.detach() for k, v in model.named_parameters()}  # the 1.1 split
    buffers = {k: v.detach() for k, v in model.named_buffers()}
    with pytest.raises(ValueError, match=r"frozen in the module.*split_module"):
        step.init(params, buffers, key=sbfunc.random.key(0))


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable low-rank update ``B @ A`` (LoRA's form; ``B``
    starts at zero, as in the paper)."""

    def __init__(self, base: nn.Linear, rank: int = 2) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        self.a = nn.Parameter(torch.randn(rank, base.in_features) * 0.1)
        self.b = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + x @ self.a.T @ self.b.T


def test_a_lora_adapter_trains_only_its_low_rank_pair():
    torch.manual_seed(0)
    model = nn.Sequential(LoRALinear(nn.Linear(8, 8)), nn.ReLU(), nn.Linear(8, 3))
    model[2].requires_grad_(False)
    sb = sbfunc.SelectiveBackprop(0.0, 1.0, keep=0.5, interrupt=0)
    step = sbfunc.make_train_step(
        sbfunc.per_sample_loss(model, F.cross_entropy),
        sbfunc.optim.adamw(1e-2, weight_decay=0.1),
        [sb],
    )
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))
    assert sorted(state.params) == ["0.a", "0.b"]
    g = torch.Generator().manual_seed(1)
    after = state
    for _ in range(3):
        batch = (torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g))
        after, _ = step(after, batch)
    _assert_frozen(state, after, {"0.base.weight", "0.base.bias", "2.weight", "2.bias"})
    assert not torch.equal(state.params["0.b"], after.params["0.b"])


def test_peft_lora_on_a_gpt2_trains_only_the_adapters():
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    config = transformers.GPT2Config(
        vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=2, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    lora = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["c_attn"])
    model = peft.get_peft_model(transformers.GPT2LMHeadModel(config), lora)
    loss_fn = sbfunc.per_sample_loss(
        model, sbfunc.module.next_token_cross_entropy, input=("input_ids", "attention_mask"),
        target="labels", output="logits",
    )  # fmt: skip
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.adamw(1e-2, weight_decay=0.1),
                                  [TokenSelection(0.5, score="loss")])  # fmt: skip
    state = step.init(
        *sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0), total_steps=4
    )
    assert state.params and all("lora_" in k for k in state.params)
    ids = torch.randint(0, 50, (4, 12), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    after = state
    for _ in range(2):
        after, _ = step(after, batch)
    frozen = {k for k, p in model.named_parameters() if not p.requires_grad}
    assert len(frozen) > 20
    _assert_frozen(state, after, frozen)
    assert any(not torch.equal(state.params[k], after.params[k]) for k in state.params)
