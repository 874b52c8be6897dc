"""Nothing is mutated after construction.

Every public algorithm (the suite's cases, the combinators, a renamed one), every selection
policy and every optimizer and schedule of ``sbfunc.optim`` is built, run through a few eager
steps of :func:`sbfunc.make_train_step`, and then holds exactly what it held before: a deep
snapshot of its fields (closures and bound methods included, tensors compared with
``torch.equal``) is unchanged. Setting an attribute on an algorithm (or a surgery) raises.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from functools import partial
from types import BuiltinFunctionType, FunctionType, MethodType, ModuleType
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sbfunc
from sbfunc import algorithms as A
from sbfunc import engine, optim, policies
from sbfunc import random as sbrandom
from sbfunc.algorithms import Surgery
from sbfunc.distributed import per_rank
from sbfunc.score import Scoring
from tests.algorithms.test_registry import CASES, ImageNet, TokenNet, _data, _loss, _sb
from tests.policies.test_registry import NEEDS_IDS, NUM_FEATURES, NUM_IDS, POLICIES

STEPS = 2
_ATOMS = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device)
_OPAQUE = (type, ModuleType, BuiltinFunctionType)


def snapshot(obj: Any) -> Any:
    """A deep, comparable copy of everything ``obj`` holds (cycles as back-references)."""
    seen: dict[int, int] = {}
    keep: list[Any] = []  # keeps the walked objects alive, so their ids stay unique

    def walk(x: Any) -> Any:
        if isinstance(x, _ATOMS) or x is Ellipsis:
            return x
        if isinstance(x, _OPAQUE):
            return ("opaque", x)
        if id(x) in seen:
            return ("seen", seen[id(x)])
        seen[id(x)] = len(seen)
        keep.append(x)
        if isinstance(x, torch.Tensor):
            return ("tensor", x.detach().clone())
        if isinstance(x, nn.Module):  # its tensors and mode, not torch's internals
            return ("module", type(x), x.training, walk(dict(x.state_dict(keep_vars=True))))
        if isinstance(x, list | tuple):
            return (type(x), tuple(walk(v) for v in x))
        if isinstance(x, dict):
            return (type(x), tuple((walk(k), walk(v)) for k, v in x.items()))
        if isinstance(x, set | frozenset):
            return (type(x), frozenset(x))
        if isinstance(x, MethodType):
            return ("method", x.__func__, walk(x.__self__))
        if isinstance(x, FunctionType):
            cells = tuple(c.cell_contents for c in x.__closure__ or ())
            return (
                "function",
                x.__code__,
                walk(cells),
                walk(x.__defaults__),
                walk(x.__kwdefaults__),
            )
        if isinstance(x, partial):
            return ("partial", walk(x.func), walk(x.args), walk(x.keywords))
        fields = dict(getattr(x, "__dict__", {}))
        for cls in type(x).__mro__:
            for slot in getattr(cls, "__slots__", ()):
                if hasattr(x, slot):
                    fields[slot] = getattr(x, slot)
        return ("object", type(x), walk(fields))

    return walk(obj)


def assert_same(a: Any, b: Any, path: str = "") -> None:
    """``a == b`` for two snapshots, tensors by ``torch.equal`` (NaN equal to NaN)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), path
        assert a.dtype == b.dtype and a.shape == b.shape, path
        same_nan = a.is_floating_point() and torch.equal(a.isnan(), b.isnan())
        assert torch.equal(a, b) or (same_nan and torch.equal(a.nan_to_num(), b.nan_to_num())), (
            f"a tensor changed at {path}"
        )
    elif isinstance(a, tuple) and isinstance(b, tuple):
        assert len(a) == len(b), f"the structure changed at {path}"
        for i, (u, v) in enumerate(zip(a, b, strict=True)):
            assert_same(u, v, f"{path}/{i}")
    elif isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        assert math.isnan(b), path
    else:
        assert type(a) is type(b) and a == b, f"{a!r} became {b!r} at {path}"


def algorithms_in(algs: Any) -> list[Any]:
    """Every algorithm of a list, the parts of combinators included."""
    out = []
    for alg in algs:
        out.append(alg)
        out.extend(algorithms_in(alg.parts))
    return out


def assert_frozen(alg: Any) -> None:
    with pytest.raises(AttributeError, match="is frozen: build a new one"):
        alg.name = "changed"
    with pytest.raises(AttributeError, match="is frozen"):
        alg.brand_new_field = 1
    with pytest.raises(AttributeError, match="is frozen"):
        del alg.name


def train(loss_fn, optimizer, algorithms, params, buffers, batches, **kwargs):
    """Build a step and run ``batches`` through it; return what must not change, before and
    after, and the step's (bound) algorithms."""
    step = sbfunc.make_train_step(loss_fn, optimizer, algorithms, **kwargs)
    held = (list(algorithms), list(step.algorithms), optimizer)
    before = snapshot(held)
    state = step.init(params, buffers, key=sbrandom.key(0), total_steps=len(batches))
    for batch in batches:
        state, _ = step(state, batch)
    return before, snapshot(held), step.algorithms


@pytest.mark.slow  # 24 cases, about 30 s on 2 CPU cores
@pytest.mark.parametrize("name", list(CASES))
def test_every_algorithm_of_the_suite_is_unchanged_by_steps_and_frozen(name):
    case = CASES[name]
    torch.manual_seed(0)
    surgery_before = snapshot(case.surgery)
    model = case.surgery(ImageNet() if case.kind == "image" else TokenNet())
    assert_same(surgery_before, snapshot(case.surgery), "surgery")
    loss_fn = _loss(model, case.kind, "train")
    algorithms = [*case.algorithms(model, loss_fn), _sb(model, case.kind)]
    optimizer = optim.sgd(0.1) if case.optimizer is None else case.optimizer
    params, buffers = sbfunc.split_module(model, clone=True)
    batches = _data(case.kind)[:STEPS]
    before, after, bound = train(loss_fn, optimizer, algorithms, params, buffers, batches)
    assert_same(before, after)
    for alg in algorithms_in([*algorithms, *bound]):
        assert_frozen(alg)
    owner = getattr(case.surgery, "__self__", case.surgery)
    if isinstance(owner, Surgery):
        assert_frozen(owner)


def _unbound_sb(**kwargs: Any) -> sbfunc.Algorithm:
    """Selective Backprop that takes the step's loss (its ``for_step`` returns a new one)."""
    return sbfunc.SelectiveBackprop(0.0, 1.0, interrupt=0, **kwargs)


COMBINED: dict[str, Callable[[], list[sbfunc.Algorithm]]] = {
    "chain": lambda: [engine.sequence(A.CutOut(length=0.25), _unbound_sb(), name="both")],
    "named_sequence": lambda: [engine.named_sequence(cut=A.CutOut(length=0.25), sb=_unbound_sb())],
    "on_events": lambda: [engine.on_events(_unbound_sb(), [sbfunc.Event.AFTER_DATALOADER])],
    "during": lambda: [engine.during(_unbound_sb(), 0.0, 0.5)],
    "every_n_steps": lambda: [engine.every_n_steps(_unbound_sb(), 2, offset=1)],
    "when": lambda: [engine.when(_unbound_sb(), lambda s: True)],
    "schedule_hyperparams": lambda: [
        engine.schedule_hyperparams(sbfunc.SelectiveBackprop)(
            start=0.0, end=1.0, keep=lambda t: 0.25 if t < 0.5 else 0.5, interrupt=0
        )
    ],
    "renamed": lambda: [A.CutOut(length=0.25).renamed("second_cutout"), _unbound_sb()],
    "downsampled scoring": lambda: [_unbound_sb(scale_factor=0.5)],
    "per_rank": lambda: [per_rank(A.CutOut(length=0.25)), _unbound_sb()],
}


@pytest.mark.parametrize("name", list(COMBINED))
def test_every_combinator_is_unchanged_by_steps_and_frozen(name):
    torch.manual_seed(0)
    model = ImageNet()
    loss_fn = _loss(model, "image", "train")
    algorithms = COMBINED[name]()
    params, buffers = sbfunc.split_module(model, clone=True)
    batches = _data("image")[:STEPS]
    before, after, bound = train(loss_fn, optim.sgd(0.1), algorithms, params, buffers, batches)
    assert_same(before, after)
    for alg in algorithms_in([*algorithms, *bound]):
        assert_frozen(alg)


def _dict_batches(steps: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        {
            "x": torch.randn(8, 4, generator=g),
            "y": torch.randint(0, 3, (8,), generator=g),
            "ids": torch.randperm(NUM_IDS, generator=g)[:8],
        }
        for _ in range(steps)
    ]


def _linear_model() -> tuple[nn.Module, Any]:
    """A seeded 4 -> 3 linear model and its per-sample loss on ``{"x", "y"}`` batches."""
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    return model, sbfunc.per_sample_loss(model, F.cross_entropy, input="x", target="y")


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_is_unchanged_by_steps(name):
    policy = POLICIES[name]()
    model, loss_fn = _linear_model()
    if policy.needs:  # the registry's signal policies read 8 features of 3 classes
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, NUM_FEATURES), nn.Tanh(), nn.Linear(NUM_FEATURES, 3))
        loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, input="x", target="y")
    ids = "ids" if name in NEEDS_IDS else None
    sb = sbfunc.SelectiveBackprop(0.0, 1.0, interrupt=0, policy=policy, ids=ids)
    params, buffers = sbfunc.split_module(model, clone=True)
    before, after, _ = train(loss_fn, optim.sgd(0.1), [sb], params, buffers, _dict_batches(3))
    assert_same(before, after)
    assert_same(snapshot(POLICIES[name]()), snapshot(policy))  # as built, after the steps
    with pytest.raises(AttributeError):
        policy.select = None  # a NamedTuple


def _sgd_with(schedule: optim.Schedule) -> optim.GradientTransformation:
    return optim.sgd(schedule, momentum=0.9)


OPTIMIZERS: dict[str, Callable[[], optim.GradientTransformation]] = {
    "sgd": lambda: optim.sgd(0.1, momentum=0.9, nesterov=True, weight_decay=1e-2),
    "adam": lambda: optim.adam(1e-2, weight_decay=1e-2, amsgrad=True),
    "adamw": lambda: optim.adamw(1e-2),
    "decoupled_sgdw": lambda: optim.decoupled_sgdw(0.1, momentum=0.9, weight_decay=1e-2),
    "decoupled_adamw": lambda: optim.decoupled_adamw(1e-2, weight_decay=1e-2),
    "add_decayed_weights": lambda: optim.chain(optim.add_decayed_weights(1e-2), optim.scale(-0.1)),
    "apply_if_finite": lambda: optim.apply_if_finite(optim.sgd(0.1), 2),
    "dynamic_loss_scale": lambda: optim.dynamic_loss_scale(optim.sgd(0.1)),
    "chain": lambda: optim.chain(optim.clip_by_global_norm(1.0), optim.sgd(0.1)),
    "clip_by_global_norm": lambda: optim.chain(
        optim.clip_by_global_norm(0.5, formula="optax"), optim.scale(-0.1)
    ),
    "decoupled_weight_decay": lambda: optim.chain(
        optim.scale(-0.1), optim.decoupled_weight_decay(1e-2, learning_rate=0.1, initial_lr=0.1)
    ),
    "multi_steps": lambda: optim.multi_steps(optim.adam(1e-2), 2),
    "masked": lambda: optim.masked(optim.adam(1e-2), lambda p: {k: p[k].dim() > 1 for k in p}),
    "polynomial_schedule": lambda: _sgd_with(optim.polynomial_schedule(0.1, 0.0, 2.0, 2)),
    "scale_by_rms": lambda: optim.chain(
        optim.scale_by_rms(bias_correction=True), optim.scale(-0.1)
    ),
    "set_to_zero": lambda: optim.chain(optim.sgd(0.1), optim.set_to_zero()),
    "stretch_schedule": lambda: _sgd_with(
        optim.stretch_schedule(optim.linear_schedule(0.1, 0.0, 4), 0.5)
    ),
    "scale": lambda: optim.scale(-0.1),
    "scale_by_adam": lambda: optim.scale_by_adam(learning_rate=1e-2),
    "scale_by_learning_rate": lambda: optim.scale_by_learning_rate(0.1),
    "trace": lambda: optim.chain(optim.trace(0.9, nesterov=True), optim.scale(-0.1)),
    "constant_schedule": lambda: _sgd_with(optim.constant_schedule(0.1)),
    "cosine_decay_schedule": lambda: _sgd_with(optim.cosine_decay_schedule(0.1, 2)),
    "exponential_decay": lambda: _sgd_with(optim.exponential_decay(0.1, 1, 0.5)),
    "join_schedules": lambda: _sgd_with(
        optim.join_schedules([optim.constant_schedule(0.1), optim.linear_schedule(0.1, 0, 2)], [1])
    ),
    "linear_schedule": lambda: _sgd_with(optim.linear_schedule(0.1, 0.0, 2)),
    "piecewise_constant_schedule": lambda: _sgd_with(
        optim.piecewise_constant_schedule(0.1, {1: 0.5})
    ),
    "warmup_cosine_decay_schedule": lambda: _sgd_with(
        optim.warmup_cosine_decay_schedule(0.0, 0.1, 1, 3)
    ),
}


def test_every_optimizer_and_schedule_has_a_case():
    """A new transformation or schedule in sbfunc.optim must get a case here."""
    returns = {"GradientTransformation", "Schedule"}
    public = {
        name
        for name in optim.__all__
        if inspect.isfunction(getattr(optim, name))
        and inspect.signature(getattr(optim, name)).return_annotation in returns
    }
    assert public == set(OPTIMIZERS)


def test_every_policy_constructor_has_a_case():
    built = {type(p()).__name__ for p in POLICIES.values()}
    assert built == {"Policy"}
    public = {
        name
        for name in policies.__all__
        if inspect.isfunction(getattr(policies, name))
        and inspect.signature(getattr(policies, name)).return_annotation == "Policy"
    }
    called = {n for n in public if any(n in inspect.getsource(f) for f in POLICIES.values())}
    assert public - {"make_policy", "stateless"} == called


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_every_optimizer_is_unchanged_by_steps_and_immutable(name):
    model, loss_fn = _linear_model()
    optimizer = OPTIMIZERS[name]()
    params, buffers = sbfunc.split_module(model, clone=True)
    before, after, _ = train(loss_fn, optimizer, [], params, buffers, _dict_batches(3))
    assert_same(before, after)
    assert_same(snapshot(OPTIMIZERS[name]()), snapshot(optimizer))  # as built, after the steps
    with pytest.raises(AttributeError):
        optimizer.update = None  # a NamedTuple
    record = getattr(optimizer.update, "__self__", None)
    if record is not None:
        with pytest.raises(AttributeError):
            record.name = "changed"  # a frozen dataclass


def test_the_snapshot_sees_a_change_deep_inside():
    holder = {"w": torch.zeros(2), "f": (lambda box: lambda: box)([1])}
    before = snapshot(holder)
    holder["f"]()[0] = 2  # in a closure
    with pytest.raises(AssertionError):
        assert_same(before, snapshot(holder))
    assert_same(snapshot(Scoring()), snapshot(Scoring()))
