"""Every public module shows only its API in ``dir()``: its ``__all__`` (and, for packages, the
documented submodules), never the names it imports (``Any``, ``torch``, ``check_int``)."""

import ast
import importlib
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from tests.helpers import resolve_face

ROOT = Path(__file__).resolve().parents[1]
DIRECTIVE = re.compile(r"^::: (sbfunc(?:\.\w+)*)\s*$", re.MULTILINE)


def documented() -> list[str]:
    """The public modules: ``sbfunc`` and every module with a section in the API reference."""
    names = {"sbfunc"}
    for page in (ROOT / "docs" / "reference").glob("*.md"):
        names.update(DIRECTIVE.findall(page.read_text()))
    return sorted(names)


PUBLIC = documented()


def allowed(name: str) -> set[str]:
    """What ``dir()`` of ``name`` may show: ``__all__``, its documented child modules, and
    ``sbfunc.__version__``."""
    mod = importlib.import_module(name)
    prefix = name + "."
    children = {p[len(prefix) :] for p in PUBLIC if p.startswith(prefix)}
    return set(mod.__all__) | children | ({"__version__"} if name == "sbfunc" else set())


def test_the_public_modules_are_the_documented_namespaces():
    assert {"sbfunc", "sbfunc.datasets", "sbfunc.optim", "sbfunc.policies", "sbfunc.step"} <= set(
        PUBLIC
    )
    assert len(PUBLIC) >= 20  # every reference page's modules


@pytest.mark.parametrize("name", PUBLIC)
def test_dir_shows_the_api_and_nothing_else(name):
    mod = importlib.import_module(name)
    shown = set(dir(mod))
    assert shown <= allowed(name), sorted(shown - allowed(name))
    assert set(mod.__all__) <= shown  # the whole API is listed
    assert dir(mod) == sorted(shown)


@pytest.mark.parametrize("name", PUBLIC)
def test_every_exported_name_resolves(name):
    mod = importlib.import_module(name)
    assert len(mod.__all__) == len(set(mod.__all__)), "a name listed twice"
    missing = [n for n in mod.__all__ if not hasattr(mod, n)]
    assert missing == []
    star: dict = {}
    exec(f"from {name} import *", star)
    assert set(star) - {"__builtins__"} == set(mod.__all__)


def test_datasets_hides_its_imports():
    import sbfunc

    shown = dir(sbfunc.datasets)
    assert not {"Any", "Iterator", "importlib", "torch", "check_int", "sbrandom"} & set(shown)
    assert shown == sorted(sbfunc.datasets.__all__)
    assert {"Split", "batches", "digits", "mnist1d", "with_label_noise", "stdlib_corpus"} <= set(
        shown
    )


def test_packages_list_their_documented_submodules_but_not_their_internals():
    import sbfunc
    import sbfunc.step

    top = dir(sbfunc)
    assert {"step", "batch", "module", "datasets", "__version__"} <= set(top)
    assert "_checkpoint_checks" not in top
    assert "_loop" not in dir(sbfunc.step) and "fit" in dir(sbfunc.step)
    assert sbfunc.step._loop.fit is sbfunc.fit  # hidden from dir(), still importable


def test_the_top_level_is_the_spine_and_the_sub_packages():
    import sbfunc

    assert len(sbfunc.__all__) <= 34
    assert {"make_train_step", "fit", "TrainState", "SelectiveBackprop", "algorithms"} <= set(
        sbfunc.__all__
    )
    assert "MixUp" not in dir(sbfunc) and "take" not in dir(sbfunc)


INTERNAL_FACES = {"sbfunc.engine.internal"}
ENGINE_INTERNALS = ("Carry", "Plan", "Planner", "advance_time", "apply_planned", "in_step")
ENGINE_INTERNALS += ("step_key", "stream_ids")
"""The internal faces (``equinox.internal``'s model): public modules without a stability
guarantee, for the code that builds a step."""


def test_every_module_that_is_not_a_face_is_private_by_name():
    """The faces are the packages' ``__init__``, the documented top-level modules and the
    internal faces; every other module's name starts with ``_`` (CONTRIBUTING.md, "Privacy")."""
    faces = {"types", "validation", "batch", "checkpoint"}
    package = ROOT / "sbfunc"
    public = [
        str(p.relative_to(package))
        for p in package.rglob("*.py")
        if p.name != "__init__.py"
        and not any(part.startswith("_") for part in p.relative_to(package).parts)
        and p.relative_to(package).parts[0].removesuffix(".py") not in faces
        and ".".join(p.relative_to(ROOT).with_suffix("").parts) not in INTERNAL_FACES
    ]
    assert public == []
    assert set(PUBLIC) >= INTERNAL_FACES  # documented, as having no stability guarantee


def test_the_step_reaches_the_engine_internals_through_their_face():
    """``sbfunc.engine`` lists the API an algorithm author uses; what only a step is built from
    (the planner, the carry, the keys) is on ``sbfunc.engine.internal`` and nowhere else."""
    import sbfunc.engine
    import sbfunc.engine.internal

    internal = set(sbfunc.engine.internal.__all__)
    assert internal == {*ENGINE_INTERNALS, "Clock"}  # Clock: the step's own until 1.2
    assert not internal & set(sbfunc.engine.__all__)
    for path in sorted((ROOT / "sbfunc").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "sbfunc.engine":
                leaked = internal & {a.name for a in node.names}
                assert not leaked, f"{path.relative_to(ROOT)}: {sorted(leaked)}"


# The 0.3 spellings removed in 1.1: none resolves any more.
REMOVED_0_3 = {
    "sbfunc": ("State", "chain", "named_chain", "inject_hyperparams", "MixUp", "take", "Trace"),
    "sbfunc.engine": ("State", "Schedule", "chain", "named_chain", "inject_hyperparams"),
}


@pytest.mark.parametrize(("module", "name"), [(m, n) for m, ns in REMOVED_0_3.items() for n in ns])
def test_the_0_3_aliases_are_gone(module, name):
    mod = importlib.import_module(module)
    with pytest.raises(AttributeError, match=f"no attribute '{name}'"):
        getattr(mod, name)


def test_the_0_3_train_spellings_are_gone():
    import sbfunc

    loss_fn = sbfunc.per_sample_loss(torch.nn.Linear(2, 2), torch.nn.functional.mse_loss)
    with pytest.raises(TypeError, match="train"):
        sbfunc.per_sample_loss(torch.nn.Linear(2, 2), torch.nn.functional.mse_loss, train=True)
    assert not hasattr(loss_fn, "with_train") and not hasattr(type(loss_fn), "train")
    assert not hasattr(sbfunc.step.TrainStep, "fire")


# Public names that moved (each kept its name): release -> (old module, name, new module); each
# still resolves until 1.3, with a DeprecationWarning that names its new home.
MOVED = {
    "1.1": [
        ("sbfunc.policies", "apply_policy", "sbfunc.selective_backprop"),
        ("sbfunc.policies", "Queue", "sbfunc.selective_backprop"),
        ("sbfunc.select", "divbs_indices", "sbfunc.policies"),
        ("sbfunc.select", "rank_power_log_weights", "sbfunc.policies"),
        ("sbfunc.passes", "register_pass", "sbfunc.engine"),
        ("sbfunc.rows", "ROWS", "sbfunc.types"),
        ("sbfunc.module_io", "Mode", "sbfunc.module"),
        ("sbfunc.module_eval", "predict", "sbfunc.module"),
    ],
    "1.2": [
        ("sbfunc.policies", "EmptyState", "sbfunc.types"),
        ("sbfunc.types", "Key", "sbfunc.random"),
        ("sbfunc.algorithms", "SelectiveBackprop", "sbfunc.selective_backprop"),
        ("sbfunc.compat", "should_selective_backprop", "sbfunc.selective_backprop"),
        *(("sbfunc.engine", name, "sbfunc.engine.internal") for name in ENGINE_INTERNALS),
    ],
}


@pytest.mark.parametrize(
    ("since", "old_module", "name", "home"),
    [(since, *move) for since, moves in MOVED.items() for move in moves],
)
def test_moved_names_warn_and_resolve_to_their_new_home(since, old_module, name, home):
    new = getattr(importlib.import_module(home), name)
    assert name in importlib.import_module(home).__all__
    old = resolve_face(old_module)  # sbfunc.passes and the like are gone: their namespace warns
    assert name not in dir(old)
    message = f"{old_module}.{name} moved to {home}.{name} in sbfunc {since}; the old name is "
    with pytest.warns(DeprecationWarning, match=re.escape(message + "removed in 1.3")) as caught:
        alias = getattr(old, name)
    assert alias is new
    assert caught[0].filename == __file__  # stacklevel: the warning points at the caller


# Names on two faces that another change of issue 42 removes (sbfunc/optim/ is not this one's).
PENDING_FACES: set[tuple[str, str]] = set()


def test_each_public_name_is_on_one_face():
    """A name is listed by one face only; the top level re-exports the spine from them."""
    faces: dict[str, list[str]] = {}
    for face in PUBLIC:
        for name in importlib.import_module(face).__all__ if face != "sbfunc" else ():
            faces.setdefault(name, []).append(face)
    twice = {
        name: where
        for name, where in faces.items()
        if len([f for f in where if (name, f) not in PENDING_FACES]) > 1
    }
    assert twice == {}
    import sbfunc

    for name in sbfunc.__all__:
        value = getattr(sbfunc, name)
        if isinstance(value, types.ModuleType):  # a sub-package
            assert value is importlib.import_module(f"sbfunc.{name}"), name
        else:
            assert [getattr(importlib.import_module(f), name) for f in faces[name]] == [value]


def _module_level_names(path: Path) -> set[str]:
    """The names a module defines at its top (functions, classes, assignments), TypeVars and
    dunders left out."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            value = node.value
            if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "TypeVar":
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return {n for n in names if not n.startswith("__")}


# Defined twice in sbfunc/optim/, which another change of issue 42 owns.
PENDING_DEFINITIONS: set[str] = set()


def test_each_name_is_defined_in_one_module():
    """A name (but a private helper's) defined at the top of two modules is either one thing
    written twice or two things with one name (issue 42: ``Device``, ``Path``)."""
    modules: dict[str, list[str]] = {}
    for path in sorted((ROOT / "sbfunc").rglob("*.py")):
        for name in _module_level_names(path):
            modules.setdefault(name, []).append(str(path.relative_to(ROOT)))
    twice = {
        name: where
        for name, where in modules.items()
        if len(where) > 1 and not name.startswith("_") and name not in PENDING_DEFINITIONS
    }
    assert twice == {}


def test_an_unknown_top_level_name_is_an_attribute_error():
    import sbfunc

    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        sbfunc.nothing  # noqa: B018


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300
    )


def test_import_sbfunc_does_not_import_kornia():
    code = "import sys, sbfunc, sbfunc.algorithms; print('kornia' in sys.modules)"
    done = _run(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_the_image_algorithms_name_the_extra_when_kornia_is_missing():
    code = """
import sys
sys.modules["kornia"] = None  # kornia not installed
import torch
import sbfunc
from sbfunc.algorithms import randaugment_image, resize_batch
from sbfunc.algorithms import AugMix, BlurPool, ProgressiveResizing, RandAugment

x = torch.rand(2, 3, 8, 8)
calls = {
    "blurpool": lambda: BlurPool()(torch.nn.Sequential(torch.nn.MaxPool2d(2)))(x),
    "randaugment": lambda: randaugment_image(x, key=sbfunc.random.key(0)),
    "resize": lambda: resize_batch(x, torch.zeros(2), 0.5),
    # the algorithms refuse at construction, before any step
    "BlurPool": BlurPool, "RandAugment": RandAugment, "AugMix": AugMix,
    "ProgressiveResizing": ProgressiveResizing,
}
for name, call in calls.items():
    try:
        call()
    except ImportError as error:
        print(name, error)
    else:
        print(name, "ran without kornia")
"""
    done = _run(code)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 7
    for line in lines:
        assert "needs kornia: pip install 'sbfunc[image]'" in line, line


def test_import_sbfunc_and_an_eager_step_do_not_import_the_compiler():
    """``torch._dynamo`` (seconds of import time on a small machine) loads only when a step is
    compiled: ``import sbfunc``, building a step and running it eagerly never import it."""
    code = """
import sys, torch
import sbfunc
print("torch._dynamo" in sys.modules)
m = torch.nn.Linear(3, 2)
loss_fn = sbfunc.per_sample_loss(m, torch.nn.functional.cross_entropy)
sb = sbfunc.SelectiveBackprop(start=0.0, end=1.0, interrupt=0)
step = sbfunc.make_train_step(loss_fn, sbfunc.optim.adam(1e-3), [sb])
state = step.init(*sbfunc.split_module(m, clone=True), key=sbfunc.random.key(0), total_steps=2)
state, _ = step(state, (torch.randn(8, 3), torch.randint(0, 2, (8,))))
print("torch._dynamo" in sys.modules)
"""
    done = _run(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]


def test_import_sbfunc_leaves_the_leaf_packages_until_they_are_used():
    """``import sbfunc`` imports the spine; the sub-packages it never needs (``sbfunc._LAZY``:
    Composer's suite, per-sample curvature, the datasets, the models, the compat layer) load on
    first use, by attribute or by ``from sbfunc import ...``, and are the same modules."""
    code = """
import sys, sbfunc
lazy = sorted(sbfunc._LAZY)
print(*[f"sbfunc.{n}" in sys.modules for n in lazy])
from sbfunc import models
print(sbfunc.algorithms.CutOut.__module__, models is sys.modules["sbfunc.models"])
print(*[f"sbfunc.{n}" in sys.modules for n in lazy])
"""
    done = _run(code)
    assert done.returncode == 0, done.stderr
    import sbfunc

    assert {"algorithms", "compat", "datasets", "models", "per_sample"} == sbfunc._LAZY
    first, used, after = done.stdout.splitlines()
    assert first.split() == ["False"] * 5
    assert used.split() == ["sbfunc.algorithms._cutout", "True"]
    assert after.split() == ["True", "False", "False", "True", "False"]
