"""``make_train_step(precision=...)``: the forward and the loss under ``torch.autocast``
(Composer's ``amp_bf16``/``amp_fp16``), float32 master weights, and float16's dynamic loss
scale (``sbfunc.optim.dynamic_loss_scale``): the scaled loss is differentiated, the gradients
are unscaled before anything reads them, an overflow skips the update and is counted, the
scale backs off and grows, and a run resumes bit for bit."""

import io

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import sbfunc
from sbfunc import optim
from tests.helpers import assert_identical, split


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))


def _batches(n=4, rows=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.randn(rows, 6, generator=g)
        out.append((x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()))
    return out


def _run(step, model, batches, state=None):
    if state is None:
        state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))
    metrics = []
    for b in batches:
        state, m = step(state, b)
        metrics.append(m)
    return state, metrics


def _recording(inner, seen):
    """``inner``, recording the gradients it receives."""

    def update(grads, state, params=None):
        seen.append(grads)
        return inner.update(grads, state, params)

    return optim.GradientTransformation(inner.init, update)


def _gained_loss(model):
    """A loss ``gain * cross_entropy`` with the per-row gain in the batch (a huge gain
    overflows the scaled gradients while the loss stays finite)."""
    ce = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")

    def loss_fn(params, buffers, batch):
        x, y, gain = batch
        return ce(params, buffers, (x, y)) * gain

    return loss_fn


@pytest.mark.parametrize(
    ("precision", "dtype"), [("amp_bf16", torch.bfloat16), ("amp_fp16", torch.float16)]
)
def test_the_forward_runs_in_the_autocast_dtype_params_and_grads_stay_float32(precision, dtype):
    model, seen, grads = _model(), [], []
    ce = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")

    def loss_fn(params, buffers, batch):
        logits = torch.func.functional_call(model, (params, buffers), (batch[0],))
        seen.append(logits.dtype)
        return F.cross_entropy(logits, batch[1], reduction="none")

    opt = _recording(optim.adam(1e-2), grads)
    if precision == "amp_fp16":
        opt = optim.dynamic_loss_scale(opt)
    step = sbfunc.make_train_step(loss_fn, opt, precision=precision)
    try:
        state, metrics = _run(step, model, _batches(2))
    except (RuntimeError, NotImplementedError) as e:  # a CPU kernel missing for the dtype
        pytest.skip(f"{precision} on the CPU: {e}")
    assert seen == [dtype, dtype]
    assert all(g.dtype == torch.float32 for gs in grads for g in gs.values())
    assert all(p.dtype == torch.float32 for p in state.params.values())
    inner = state.opt_state.inner if precision == "amp_fp16" else state.opt_state
    assert all(m.dtype == torch.float32 for m in inner.exp_avg.values())
    assert metrics[-1].loss.dtype == torch.float32 and not bool(metrics[-1].skipped)
    # reduced precision, so not fp32's result, but close to it
    fp32 = sbfunc.make_train_step(ce, optim.adam(1e-2))
    ref, _ = _run(fp32, model, _batches(2))
    assert not all(torch.equal(ref.params[k], state.params[k]) for k in ref.params)
    torch.testing.assert_close(state.params, ref.params, atol=5e-3, rtol=0)


def test_a_module_loss_runs_its_forward_and_criterion_under_autocast():
    model, outputs = _model(), []

    class Spy(sbfunc.Algorithm):
        def init(self, key):
            return ()

        def match(self, event, state):
            return event == sbfunc.Event.AFTER_FORWARD

        def apply(self, event, state):
            outputs.append(state.outputs.dtype)
            return state

    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    step = sbfunc.make_train_step(loss_fn, optim.sgd(0.1), [Spy()], precision="amp_bf16")
    _, metrics = _run(step, model, _batches(1))
    assert outputs == [torch.bfloat16] and step.precision == "amp_bf16"
    assert metrics[0].loss.dtype == torch.float32  # cross-entropy autocasts to float32


@settings(max_examples=4, derandomize=True, database=None, deadline=None)
@given(power=st.integers(-8, 24), microbatches=st.sampled_from([None, 2]))
def test_a_power_of_two_loss_scale_changes_nothing_when_finite(power, microbatches):
    # the scaled loss's gradients divided by the scale are the gradients, bit for bit; the
    # optimizer (here after clipping, which reads them) sees the true ones
    model, seen_plain, seen_scaled = _model(), [], []
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")

    def opt(seen):
        return optim.chain(optim.clip_by_global_norm(0.5), _recording(optim.sgd(0.1), seen))

    plain = sbfunc.make_train_step(
        loss_fn, opt(seen_plain), microbatching=split(chunks=microbatches)
    )
    scaled_opt = optim.dynamic_loss_scale(opt(seen_scaled), init_scale=2.0**power)
    scaled = sbfunc.make_train_step(loss_fn, scaled_opt, microbatching=split(chunks=microbatches))
    a, ma = _run(plain, model, _batches(2))
    b, mb = _run(scaled, model, _batches(2))
    assert_identical(seen_plain, seen_scaled)
    assert_identical(a.params, b.params)
    assert_identical([m.loss for m in ma], [m.loss for m in mb])  # reported unscaled


def test_an_overflow_skips_the_update_counts_it_and_backs_the_scale_off():
    model = _model()
    opt = optim.dynamic_loss_scale(optim.adam(1e-2), init_scale=2.0**16, growth_interval=2)
    step = sbfunc.make_train_step(_gained_loss(model), opt, precision="amp_bf16")
    (x0, y0), (x1, y1), (x2, y2) = _batches(3)
    ones = torch.ones(16)
    state, _ = _run(step, model, [(x0, y0, ones)])
    assert state.opt_state.scale.item() == 2.0**16 and state.opt_state.good_steps.item() == 1
    # 1e36 * loss is finite; times the scale, and its gradients, are not
    after, (m,) = _run(step, model, [(x1, y1, ones * 1e36)], state)
    assert bool(m.skipped) and after.time.updates_skipped.item() == 1
    assert torch.isfinite(m.loss) and m.loss > 1e35  # reported as it is, unscaled
    assert_identical(after.params, state.params)
    assert_identical(after.opt_state.inner, state.opt_state.inner)
    assert after.opt_state.scale.item() == 2.0**15 and after.opt_state.good_steps.item() == 0
    # two finite steps later the scale grows back
    final, ms = _run(step, model, [(x2, y2, ones), (x0, y0, ones)], after)
    assert not any(bool(m.skipped) for m in ms) and final.time.updates_skipped.item() == 1
    assert final.opt_state.scale.item() == 2.0**16 and final.opt_state.inner.count.item() == 3


def test_amp_fp16_trains_with_the_loss_scale():
    model = _model()
    opt = optim.dynamic_loss_scale(optim.adam(1e-2))
    step = sbfunc.make_train_step(
        sbfunc.per_sample_loss(model, F.cross_entropy), opt, precision="amp_fp16"
    )
    try:
        state, metrics = _run(step, model, _batches(8))
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip(f"float16 autocast on the CPU: {e}")
    assert float(metrics[-1].loss) < float(metrics[0].loss)
    assert state.time.updates_skipped.item() == sum(int(m.skipped) for m in metrics)


def test_resume_is_bit_for_bit_under_amp_bf16_with_a_loss_scale():
    model = _model()
    opt = optim.dynamic_loss_scale(optim.adamw(1e-2), growth_interval=2)
    step = sbfunc.make_train_step(_gained_loss(model), opt, precision="amp_bf16")
    gains = [1.0, 1.0, 1e36, 1.0, 1.0, 1.0]  # one overflow: the scale moves both ways
    batches = [(x, y, torch.full((16,), g)) for (x, y), g in zip(_batches(6), gains, strict=True)]
    whole, _ = _run(step, model, batches)
    half, _ = _run(step, model, batches[:3])
    buf = io.BytesIO()
    sbfunc.checkpoint.save(half, buf)
    template = step.init(*sbfunc.split_module(_model(1), clone=True), key=sbfunc.random.key(9))
    restored = sbfunc.checkpoint.load(io.BytesIO(buf.getvalue()), like=template)
    resumed, _ = _run(step, model, batches[3:], restored)
    assert_identical(resumed, whole)
    assert whole.time.updates_skipped.item() == 1 and whole.opt_state.scale.item() == 2.0**17


@pytest.mark.slow
def test_the_compiled_step_runs_amp_bf16_with_a_loss_scale():
    model = _model()
    opt = optim.dynamic_loss_scale(optim.adam(1e-2), growth_interval=1)
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    eager = sbfunc.make_train_step(loss_fn, opt, precision="amp_bf16")
    compiled = sbfunc.make_train_step(loss_fn, opt, precision="amp_bf16")
    compiled.compile(fullgraph=True)
    a, ma = _run(eager, model, _batches(2))
    b, mb = _run(compiled, model, _batches(2))
    assert_identical(a.opt_state.scale, b.opt_state.scale)  # grew twice: 2**18
    assert b.opt_state.scale.item() == 2.0**18 and b.time == a.time
    torch.testing.assert_close(b.params, a.params, atol=1e-4, rtol=0)
    torch.testing.assert_close(mb[-1].loss, ma[-1].loss, atol=1e-3, rtol=0)


@pytest.mark.parametrize("precision", ["amp_fp8", "bf16", "fp16", None, torch.bfloat16])
def test_an_unknown_precision_raises_naming_the_values(precision):
    loss_fn = sbfunc.per_sample_loss(_model(), F.cross_entropy)
    with pytest.raises(ValueError, match=r"precision.*'fp32', 'amp_bf16', 'amp_fp16'"):
        sbfunc.make_train_step(loss_fn, optim.sgd(0.1), precision=precision)


def test_amp_fp16_without_a_loss_scale_and_a_loss_scale_with_allow_raise():
    loss_fn = sbfunc.per_sample_loss(_model(), F.cross_entropy)
    with pytest.raises(ValueError, match="dynamic_loss_scale"):
        sbfunc.make_train_step(loss_fn, optim.adam(1e-3), precision="amp_fp16")
    scaled = optim.dynamic_loss_scale(optim.adam(1e-3))
    with pytest.raises(ValueError, match="nonfinite='allow'"):
        sbfunc.make_train_step(loss_fn, scaled, nonfinite="allow", precision="amp_bf16")
    assert sbfunc.make_train_step(loss_fn, scaled).precision == "fp32"  # any precision
