"""The README and the docs pages: their Python blocks run and every ``sbfunc.*`` name exists.

Every fenced block tagged ``python`` runs, in page order and in one namespace per page (so a
page can build on its earlier blocks), in a temporary working directory. Snippets that are
not meant to run are tagged ``py`` or ``text`` instead.
"""

import importlib
import re
import warnings
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
NAME = re.compile(r"\bsbfunc(?:\.[A-Za-z_]\w*)+")


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def python_blocks(page: Path) -> list[str]:
    return BLOCK.findall(page.read_text())


def resolve(dotted: str) -> object:
    """``sbfunc.a.b`` as an attribute chain, importing submodules on the way; a deprecated
    alias (``sbfunc.MixUp``) raises its ``DeprecationWarning``."""
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for i, part in enumerate(parts[1:], start=1):
            if not hasattr(obj, part):
                importlib.import_module(".".join(parts[: i + 1]))
            obj = getattr(obj, part)
    return obj


def run_page(page: Path, workdir: Path) -> dict:
    """Run the page's python blocks in one namespace, in ``workdir``; return the namespace."""
    namespace: dict = {"__name__": "__readme__"}
    with torch.random.fork_rng():
        for i, block in enumerate(python_blocks(page)):
            exec(compile(block, f"{page_id(page)}[block {i}]", "exec"), namespace)
    return namespace


def test_readme_leads_with_the_contract():
    """The README is short: set-up, then a step-loop quickstart; measurements live in docs."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    headings = re.findall(r"^## (.*)$", text, re.MULTILINE)
    assert headings[:2] == ["Set-up: two commands", "Quickstart"]
    (quickstart, *_) = python_blocks(ROOT / "README.md")
    assert len(quickstart.splitlines()) <= 30
    assert "state, metrics = step(state, batch)" in quickstart
    assert "step.init(" in quickstart and "sbfunc.make_train_step(" in quickstart


def test_readme_quickstart(tmp_path, monkeypatch):
    """The README's quickstart runs as printed, learns, selects, and saves a checkpoint."""
    monkeypatch.chdir(tmp_path)
    ns = run_page(ROOT / "README.md", tmp_path)
    accuracy = (ns["logits"].argmax(1) == ns["data"].y_test).float().mean().item()
    assert accuracy > 0.8
    time = ns["state"].time
    assert time.samples_backpropagated < time.samples_forwarded  # SB dropped rows
    assert (tmp_path / "state.pt").exists()


@pytest.mark.parametrize("page", [p for p in PAGES[1:] if python_blocks(p)], ids=page_id)
def test_docs_python_blocks_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch, "compile", _traced_compile)
    run_page(page, tmp_path)


_inductor_compile = torch.compile


def _traced_compile(*args, **kwargs):
    """``torch.compile`` with ``backend="aot_eager"`` unless a block names one: the pages'
    compiled steps are traced as under inductor (dynamo's and AOTAutograd's graphs, the same
    breaks and guards) without its code generation, a minute of the suite on 2 CPU cores;
    tests/step/test_compile.py runs inductor."""
    kwargs.setdefault("backend", "aot_eager")
    return _inductor_compile(*args, **kwargs)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_sbfunc_names_exist(page):
    text = page.read_text()
    # a trailing ".md"/".py" belongs to a file name, not to the Python name
    names = {n for n in NAME.findall(text) if not n.endswith((".md", ".py"))}
    missing = []
    for name in sorted(names):
        try:
            resolve(name)
        except (AttributeError, ImportError, DeprecationWarning):
            missing.append(name)
    assert not missing, f"{page_id(page)} names what sbfunc does not have: {missing}"
