"""The package's import graph: layers, privacy and no cycle (CONTRIBUTING.md, "Layout").

The rule in one sentence: a module imports sbfunc code only from a lower layer or its own
package; a module or package whose name starts with ``_`` is imported only from inside the
package that holds it, and a ``_name`` inside a module is never imported at all. The graph is
read from the source (``ast``), lazy imports included.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "sbfunc"

LAYERS: tuple[frozenset[str], ...] = tuple(
    frozenset(names.split())
    for names in (
        "_namespace _tracing",
        "types validation _frozen",
        "random",
        "_rows",
        "batch",
        "_finite",
        "optim",
        "_gradients module",
        "select score",
        "policies",
        "engine",
        "selective_backprop per_sample _checkpoint_checks",
        "algorithms checkpoint",
        "step",
        "distributed",
        "compat datasets models testing",
        "__init__",
    )
)
"""The packages (and top-level modules) from the bottom up: each imports only from the layers
below it and from itself."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, int]]:
    """``(imported module, line)`` of every ``sbfunc`` import, lazy ones included; a
    ``from sbfunc.x import y`` counts as an import of ``sbfunc.x.y`` when that is a module."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((sub if _is_module(sub) else base, node.lineno))
    return [(m, line) for m, line in found if m == "sbfunc" or m.startswith("sbfunc.")]


def _is_module(dotted: str) -> bool:
    path = ROOT.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _top(dotted: str) -> str:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _layer(top: str) -> int:
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"sbfunc.{top} is in no layer of tests/test_layering.py: add it")


GRAPH = {_module_name(p): _imports(p) for p in sorted(ROOT.rglob("*.py"))}


def test_every_package_is_in_a_layer():
    for name in GRAPH:
        _layer(_top(name))


def test_imports_go_down_the_layers():
    bad = [
        f"{src}:{line} imports {dst}"
        for src, imports in GRAPH.items()
        for dst, line in imports
        if _top(src) != _top(dst) and _layer(_top(dst)) >= _layer(_top(src))
    ]
    assert not bad, "\n".join(bad)


def test_algorithms_never_import_the_step():
    bad = [
        f"{src} imports {dst}"
        for src, imports in GRAPH.items()
        for dst, _ in imports
        if _top(src) == "algorithms" and _top(dst) == "step"
    ]
    assert not bad


def _owner_of_private(dotted: str) -> str | None:
    """The package a private name belongs to (``sbfunc.a._b.c`` -> ``sbfunc.a``), or None."""
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


def test_private_modules_are_imported_only_inside_their_package():
    bad = []
    for src, imports in GRAPH.items():
        for dst, line in imports:
            owner = _owner_of_private(dst)
            if owner is not None and not (src == owner or src.startswith(owner + ".")):
                bad.append(f"{src}:{line} imports {dst}, private to {owner}")
    assert not bad, "\n".join(bad)


def test_no_import_cycle():
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dst, _ in GRAPH.get(node, ()):
            if dst not in GRAPH or dst == node:
                continue
            if state.get(dst) == 1:
                cycle = [*path[path.index(dst) :], dst]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dst not in state:
                visit(dst, [*path, dst])
        state[node] = 2

    for name in GRAPH:
        if name not in state:
            visit(name, [name])


def _private_names(path: Path) -> list[tuple[str, str, int]]:
    """``(module, name, line)`` of every ``from sbfunc... import _name`` of a name (not a
    module)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sbfunc"):
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private and not _is_module(f"{node.module}.{alias.name}"):
                    found.append((node.module or "", alias.name, node.lineno))
    return found


def test_private_names_stay_in_their_module():
    bad = [
        f"{_module_name(path)}:{line} imports {name} from {module}"
        for path in sorted(ROOT.rglob("*.py"))
        for module, name, line in _private_names(path)
    ]
    assert not bad, "\n".join(bad)


def test_doctests_import_from_faces_only():
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            text = line.strip()
            if text.startswith(">>> ") and ("import" in text) and "sbfunc" in text:
                module = text.split()[2] if text.startswith(">>> from") else text.split()[-1]
                if _owner_of_private(module) is not None:
                    bad.append(f"{path.relative_to(ROOT.parent)}:{lineno}: {text}")
    assert not bad, "\n".join(bad)


# The tests mirror the packages (CONTRIBUTING.md, "Rules"): what can be checked mechanically.
TESTS = ROOT.parent / "tests"
PACKAGES = frozenset(p.name for p in ROOT.iterdir() if (p / "__init__.py").exists())


def test_every_test_folder_names_a_package_and_every_package_has_one():
    """``tests/x/`` holds the tests of ``sbfunc/x/``; ``tests/`` itself those of the top-level
    modules and of the whole package; ``tests/data/`` holds files, not tests."""
    folders = {
        p.name
        for p in TESTS.iterdir()
        if p.is_dir() and not p.name.startswith((".", "__")) and p.name != "data"
    }
    assert folders == PACKAGES, (sorted(folders - PACKAGES), sorted(PACKAGES - folders))


def _test_home(owners: set[str]) -> Path:
    """Where a test of the private modules of ``owners`` lives: the one package's folder, or
    ``tests/`` for the top-level modules' and for a test that reaches into several packages."""
    if len(owners) != 1 or owners == {"sbfunc"}:
        return TESTS
    return TESTS / next(iter(owners)).removeprefix("sbfunc.").replace(".", "/")


def test_a_test_of_private_modules_lives_in_their_package_folder():
    """A test that imports private modules (``sbfunc.policies._tables``, ``sbfunc._finite``)
    tests their package: it lives in that package's folder (``tests/policies/``, ``tests/``),
    or in ``tests/`` when it reaches into several packages."""
    bad = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.relative_to(TESTS).parts[0] == "data":
            continue  # scripts run against an older sbfunc
        owners = {o for dst, _ in _imports(path) if (o := _owner_of_private(dst)) is not None}
        if owners and path.parent != _test_home(owners):
            where = _test_home(owners).relative_to(ROOT.parent)
            bad.append(f"{path.relative_to(ROOT.parent)} imports {sorted(owners)}: {where}/")
    assert not bad, "\n".join(bad)
