"""``step.compile()`` leaves out the guards on library globals and keeps every other one."""

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from torch._dynamo.utils import counters

import sbfunc
from sbfunc.step._compile import compile_options, drop_library_globals, library_global

SCALE = 1.0  # read by the model below: a global of user code


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * SCALE


def _step_and_state():
    torch.manual_seed(0)
    model = Scaled()
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1))
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))
    return step, state


BATCH = (torch.ones(4, 3), torch.tensor([0, 1, 0, 1]))


def test_a_changed_user_global_still_recompiles_and_is_read():
    global SCALE
    torch._dynamo.reset()
    counters.clear()
    step, state = _step_and_state()
    step.compile(backend="eager", fullgraph=True)
    eager, _ = _step_and_state()
    try:
        for scale in (1.0, 3.0):
            SCALE = scale
            got, metrics = step(state, BATCH)
            want, eager_metrics = eager(state, BATCH)
            torch.testing.assert_close(metrics.loss, eager_metrics.loss)
            torch.testing.assert_close(got.params, want.params)
    finally:
        SCALE = 1.0
    assert counters["stats"]["unique_graphs"] == 2  # the new SCALE made a new graph


def test_library_globals_are_recognised():
    assert library_global("G['__import_sbfunc_dot_batch'].torch")
    assert library_global("G['__import_torch_dot_nn_dot_modules_dot_linear'].F.linear")
    assert library_global("G['__import_math'].inf")
    assert library_global("G['__builtins_dict___0']['len']")
    assert library_global("G['torch'].Tensor")  # a global of the traced core's module
    assert not library_global("G['__import___main__'].SCALE")
    assert not library_global("G['__import_tests_dot_step_dot_test_compile_guards'].SCALE")
    assert not library_global("L['state'].params['w']")
    assert not library_global("G['___unnamed_scope_1_c0']")


class _Entry:
    def __init__(self, name: str, is_global: bool) -> None:
        self.name, self.is_global = name, is_global


@given(st.lists(st.tuples(st.sampled_from(["G['torch'].sin", "L['x']", "G['__import_user'].K"]),
                          st.booleans())))  # fmt: skip
def test_the_filter_drops_only_global_library_guards(pairs):
    entries = [_Entry(name, is_global) for name, is_global in pairs]
    keep = drop_library_globals(entries)
    assert keep == [not (e.is_global and e.name.startswith("G['torch']")) for e in entries]


def test_library_guards_can_be_kept():
    step, state = _step_and_state()
    step.compile(backend="eager", library_guards=True)
    assert step(state, BATCH)[0].time.step == 1


def test_new_strings_do_not_recompile_a_compiled_step():
    """Text fields reach the compiled core as row indices (as under torch.compile(step))."""
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, input="x", target="y")
    sb = sbfunc.SelectiveBackprop(0.0, 1.0, keep=0.5, interrupt=0)
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1), [sb])
    step.compile(backend="eager", fullgraph=True)
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))
    for i in range(3):
        batch = {"x": torch.randn(4, 3), "y": torch.tensor([0, 1, 0, 1]),
                 "text": [f"step {i} row {j}" for j in range(4)]}  # fmt: skip
        state, metrics = step(state, batch)
        assert metrics.samples_backpropagated == 2
        assert batch["text"][0] == f"step {i} row 0"
    assert counters["stats"]["unique_graphs"] == 1


def test_compile_options_keep_the_mode_and_the_callers_choices():
    own = compile_options({"mode": "reduce-overhead", "fullgraph": True}, library_guards=False)
    assert own == {
        "fullgraph": True,
        "options": {"triton.cudagraphs": True, "guard_filter_fn": drop_library_globals},
    }
    mine = compile_options({"options": {"guard_filter_fn": len}}, library_guards=False)
    assert mine["options"]["guard_filter_fn"] is len
    both = {"mode": "default", "options": {}}  # torch.compile refuses these together
    assert compile_options(both, library_guards=False) == both
    other = {"backend": "eager", "mode": "default"}
    assert compile_options(other, library_guards=False) == other
    assert compile_options({"mode": "default"}, library_guards=True) == {"mode": "default"}
    with pytest.raises(TypeError, match="library_guards must be True or False, got 1"):
        compile_options({}, library_guards=1)


def test_a_mode_compiles():
    step, state = _step_and_state()
    step.compile(mode="reduce-overhead")  # CUDA graphs on a GPU; a plain graph on the CPU
    assert step(state, BATCH)[0].time.step == 1


def _sb_step(keep: float, lr: float):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    sb = sbfunc.SelectiveBackprop(0.0, 1.0, keep=keep)
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.adamw(lr), [sb])
    state = step.init(*sbfunc.split_module(model, clone=True), key=sbfunc.random.key(0))
    return step, state


def test_a_sweep_compiles_each_step_with_its_own_hyperparameters():
    # 1.1: torch's automatic-dynamic record is kept per code name for the whole process, so
    # the second step of a sweep over keep made keep symbolic and failed to compile
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    for keep, lr, n in [(0.5, 1e-3, 16), (0.3, 1e-3, 16), (0.3, 3e-3, 12)]:
        batch = (torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g))
        eager, state = _sb_step(keep, lr)
        compiled, _ = _sb_step(keep, lr)
        compiled.compile(backend="eager", fullgraph=True)
        want, got = eager(state, batch)[0], compiled(state, batch)[0]
        for a, b in zip(want.params.values(), got.params.values(), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_dynamic_true_is_refused_naming_the_default():
    step, _ = _step_and_state()
    with pytest.raises(ValueError, match=r"dynamic=True\) is not supported.*automatic dynamic"):
        step.compile(dynamic=True)
