"""The byte-level decoder: size, causality, padding, keyed initialisation, ALiBi surgery,
torch.func and torch.compile."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sbfunc import random as sbrandom
from sbfunc.algorithms import Alibi, AlibiMultiheadAttention, ZeroEmbedding
from sbfunc.models import CausalLM

SETTINGS = settings(max_examples=15, derandomize=True, database=None, deadline=None)
TINY = {"d_model": 16, "num_heads": 2, "num_layers": 2, "max_len": 24}
ATOL = 1e-5


def tiny(**kwargs):
    return CausalLM(**{**TINY, **kwargs}).eval()


def ids_and_mask(seed, n=3, length=12):
    ids = sbrandom.randint(sbrandom.key(seed), (n, length), 0, 256)
    return ids, torch.ones(n, length, dtype=torch.int64)


def test_default_size_is_in_the_stated_range():
    model = CausalLM()
    count = sum(p.numel() for p in model.parameters())
    assert 500_000 <= count <= 1_000_000 and count == 660_736
    logits = model(*ids_and_mask(0, n=2, length=128))
    assert logits.shape == (2, 128, 257) and logits.dtype == torch.float32


def test_untied_head_adds_a_projection():
    tied, untied = tiny(), tiny(tie_embeddings=False)
    extra = sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in tied.parameters())
    assert tied.head is None and extra == 257 * 16


def test_initialisation_is_keyed_and_leaves_the_global_rng_alone():
    state = torch.get_rng_state()
    a, b, c = tiny(key=sbrandom.key(1)), tiny(key=sbrandom.key(1)), tiny(key=sbrandom.key(2))
    assert torch.equal(torch.get_rng_state(), state)
    pa, pb, pc = (dict(m.named_parameters()) for m in (a, b, c))
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert not torch.equal(pa["wte.weight"], pc["wte.weight"])
    assert abs(float(pa["wte.weight"].detach().std()) - 0.02) < 0.004
    assert not pa["blocks.0.mlp.0.bias"].any() and bool((pa["ln_f.weight"] == 1).all())


@SETTINGS
@given(seed=st.integers(0, 999), t=st.integers(0, 11), token=st.integers(0, 255))
def test_changing_token_t_leaves_the_logits_before_t(seed, t, token):
    model = tiny()
    ids, mask = ids_and_mask(seed)
    changed = ids.clone()
    changed[:, t] = token
    a, b = model(ids, mask), model(changed, mask)
    torch.testing.assert_close(a[:, :t], b[:, :t], atol=ATOL, rtol=0)


@SETTINGS
@given(seed=st.integers(0, 999), real=st.integers(1, 12), extra=st.integers(1, 12))
def test_right_padding_leaves_the_logits_at_real_positions(seed, real, extra):
    model = tiny()
    ids, mask = ids_and_mask(seed, length=real)
    pad = sbrandom.randint(sbrandom.key(seed + 1), (3, extra), 0, 257)  # any padded content
    padded = torch.cat([ids, pad], 1)
    padded_mask = torch.cat([mask, torch.zeros(3, extra, dtype=torch.int64)], 1)
    torch.testing.assert_close(
        model(padded, padded_mask)[:, :real], model(ids, mask), atol=ATOL, rtol=0
    )


def test_masked_positions_are_not_attended():
    model = tiny()
    ids, mask = ids_and_mask(0)
    mask[:, 4] = 0
    changed = ids.clone()
    changed[:, 4] = (ids[:, 4] + 1) % 256
    a, b = model(ids, mask), model(changed, mask)
    torch.testing.assert_close(a[:, 5:], b[:, 5:], atol=ATOL, rtol=0)
    assert not torch.allclose(model(ids)[:, 5:], model(changed)[:, 5:])  # unmasked: attended


@pytest.mark.parametrize("grad", [True, False])
def test_a_row_without_tokens_leaves_the_others(grad):
    model = tiny()
    ids, mask = ids_and_mask(0)
    mask[1] = 0  # nothing to attend to: finite with grad, NaN in the fused no-grad kernel
    with torch.set_grad_enabled(grad):
        logits, alone = model(ids, mask), model(ids[[0, 2]], mask[[0, 2]])
    assert bool(logits[[0, 2]].isfinite().all())
    torch.testing.assert_close(logits[[0, 2]], alone, atol=ATOL, rtol=0)


def test_train_and_no_grad_eval_paths_agree():
    model = tiny()
    ids, mask = ids_and_mask(3)
    mask[:, 9:] = 0
    with torch.no_grad():
        fast = model(ids, mask)  # eval without grad: nn.MultiheadAttention's fused path
    slow = model.train()(ids, mask)
    real = mask.bool()
    torch.testing.assert_close(fast[real], slow[real].detach(), atol=ATOL, rtol=0)


def test_functional_call_matches_the_module_and_differentiates():
    model = tiny()
    ids, mask = ids_and_mask(1)
    params = {k: v.detach() for k, v in model.named_parameters()}
    out = torch.func.functional_call(model, params, (ids,), {"attention_mask": mask})
    torch.testing.assert_close(out, model(ids, mask))  # no param requires grad: fused path

    def loss(p):
        return torch.func.functional_call(model, p, (ids, mask)).logsumexp(-1).mean()

    grads = torch.func.grad(loss)(params)
    assert set(grads) == set(params) and all(g.isfinite().all() for g in grads.values())


def test_alibi_surgery_replaces_attention_and_positions():
    model = tiny()
    alibi = Alibi(64)(model)
    assert isinstance(alibi.wpe, ZeroEmbedding)
    assert all(isinstance(b.attn, AlibiMultiheadAttention) for b in alibi.blocks)
    ids, mask = ids_and_mask(0, length=40)  # longer than max_len = 24: extrapolation
    mask[:, 30:] = 0
    logits = alibi(ids, mask)
    changed = ids.clone()
    changed[:, 20] = (ids[:, 20] + 1) % 256
    torch.testing.assert_close(alibi(changed, mask)[:, :20], logits[:, :20], atol=ATOL, rtol=0)
    torch.testing.assert_close(alibi(ids[:, :30], mask[:, :30]), logits[:, :30], atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="at most max_len = 24"):
        model(ids, mask)


def test_without_position_embeddings():
    model = tiny(position_embeddings=False)
    assert model.wpe is None and "wpe.weight" not in dict(model.named_parameters())
    ids, mask = ids_and_mask(0, length=30)  # no table: any length
    assert model(ids, mask).shape == (3, 30, 257)
    assert isinstance(Alibi(64)(model).blocks[0].attn, AlibiMultiheadAttention)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"d_model": 30, "num_heads": 4}, ValueError, "d_model must be a multiple of num_heads"),
        ({"num_layers": 0}, ValueError, "num_layers must be an int >= 1"),
        ({"dropout": 1.0}, ValueError, "dropout must be in"),
        ({"vocab_size": 2.0}, TypeError, "vocab_size"),
        ({"tie_embeddings": 1}, TypeError, "tie_embeddings must be True or False"),
    ],
)
def test_arguments_are_validated(kwargs, error, match):
    with pytest.raises(error, match=match):
        CausalLM(**{**TINY, **kwargs})


def test_forward_compiles_fullgraph_and_matches_eager():
    model = tiny()
    ids, mask = ids_and_mask(2)
    mask[:, 8:] = 0
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")  # one graph: dynamo's
    torch.testing.assert_close(compiled(ids, mask), model(ids, mask), atol=ATOL, rtol=1e-4)
