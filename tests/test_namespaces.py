"""Every public module shows only its API in ``dir()``: its ``__all__`` (and, for packages, the
documented submodules), never the names it imports (``Any``, ``torch``, ``check_int``)."""

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

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
    assert shown == ["Split", "batches", "digits", "mnist1d", "with_label_noise"]


def test_packages_list_their_documented_submodules_but_not_their_internals():
    import sbfunc
    import sbfunc.step

    top = dir(sbfunc)
    assert {"step", "batch", "module", "datasets", "__version__"} <= set(top)
    assert "validation" not in top and "_checkpoint_checks" not in top
    assert "loop" not in dir(sbfunc.step) and "fit" in dir(sbfunc.step)
    assert sbfunc.step.loop.fit is sbfunc.fit  # hidden from dir(), still importable


def test_the_top_level_is_the_spine_and_the_sub_packages():
    import sbfunc

    assert len(sbfunc.__all__) <= 32
    assert {"make_train_step", "fit", "TrainState", "SelectiveBackprop", "algorithms"} <= set(
        sbfunc.__all__
    )
    assert "MixUp" not in dir(sbfunc) and "take" not in dir(sbfunc)


def test_internals_are_not_exported_by_their_package():
    import sbfunc

    for internal in ("Carry", "Planner", "Planned", "apply_planned", "unpack_result", "FLAGS"):
        assert internal not in sbfunc.engine.__all__
        assert not hasattr(sbfunc.engine, internal)
    exported = {n for name in PUBLIC for n in importlib.import_module(name).__all__}
    assert not {"check_ids", "check_scores", "check_keep", "check_key"} & exported
    from sbfunc.engine.plan import Planner  # still importable from its defining module

    assert Planner.__module__ == "sbfunc.engine.plan"


def _moved() -> dict[str, str]:
    import sbfunc

    return sbfunc._MOVED


@pytest.mark.parametrize("old", sorted(_moved()))
def test_every_moved_top_level_name_is_a_deprecated_alias(old):
    import sbfunc

    home, _, name = _moved()[old].partition(":")
    new = getattr(importlib.import_module(home), name)
    assert name in importlib.import_module(home).__all__  # listed at its new home
    assert old not in sbfunc.__all__ and old not in dir(sbfunc)
    message = f"sbfunc.{old} moved to {home}.{name}; the alias will be removed in 1.1"
    with pytest.warns(DeprecationWarning, match=re.escape(message)) as caught:
        alias = getattr(sbfunc, old)
    assert alias is new
    assert caught[0].filename == __file__  # stacklevel: the warning points at the caller


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
from sbfunc.algorithms import apply_blurpool, randaugment_image, resize_batch
from sbfunc.algorithms import AugMix, BlurPool, ProgressiveResizing, RandAugment

x = torch.rand(2, 3, 8, 8)
calls = {
    "blurpool": lambda: apply_blurpool(torch.nn.Sequential(torch.nn.MaxPool2d(2)))(x),
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
