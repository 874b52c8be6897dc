"""Every public module shows only its API in ``dir()``: its ``__all__`` (and, for packages, the
documented submodules), never the names it imports (``Any``, ``torch``, ``check_int``)."""

import importlib
import re
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
