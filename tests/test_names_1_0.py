"""Every name sbfunc 1.0.0's faces exported still resolves (issue 42, item 6): silently where
its face still lists it, else with one ``DeprecationWarning`` that names its new home and gives
the object found there, unless the CHANGELOG says it was removed.

The names are test data, ``tests/data/names_1_0_0.json``, written by
``tests/data/make_names_1_0_0.py`` run against the 1.0.0 sources (no 1.0 code runs here).
"""

import importlib
import json
import re
import types
import warnings
from pathlib import Path

import pytest

from tests.helpers import resolve_face

ROOT = Path(__file__).resolve().parents[1]
NAMES: dict[str, list[str]] = json.loads((ROOT / "tests/data/names_1_0_0.json").read_text())
CHANGELOG = (ROOT / "CHANGELOG.md").read_text()

# Removed on purpose, each named in the CHANGELOG.
REMOVED = {
    ("sbfunc.module", "Train"),  # the type of 0.3's train=, removed with it in 1.1
    ("sbfunc.rows", "path_str"),  # an internal helper, private since 1.1
}
# Not listed by the face, still resolving silently: the face imports the public object.
SILENT = {("sbfunc.batch", "PerSample")}  # sbfunc.types.PerSample, in batch's signatures
MOVED = re.compile(
    r"(?P<old>\S+) (?:moved|was renamed) to (?P<new>\S+(?: and \S+)*) in sbfunc 1\.[12]; "
    r"the old name is removed in 1\.3"
)
# A spelling with no name in the new API (``apply_blurpool``): the message names the new call.
SPELLING = re.compile(
    r"(?P<old>\S+) is deprecated since sbfunc 1\.2: write (?P<new>[\w.]+)\(.*; the old "
    r"spelling is removed in 1\.3"
)


def test_the_data_holds_1_0s_faces():
    assert {"sbfunc", "sbfunc.passes", "sbfunc.step", "sbfunc.compat.composer"} <= set(NAMES)
    assert len(NAMES) == 26 and sum(map(len, NAMES.values())) == 347
    assert "Duration" in NAMES["sbfunc.step"] and "passes" in NAMES["sbfunc"]


@pytest.mark.parametrize(("module", "name"), [(m, n) for m, ns in NAMES.items() for n in ns])
def test_every_1_0_name_resolves_or_names_its_new_home(module, name):
    old = resolve_face(module)
    if (module, name) in REMOVED:
        with pytest.raises(AttributeError, match=f"no attribute '{name}'"):
            getattr(old, name)
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(old, name)
    if not caught:  # still there
        assert name in old.__all__ or (module, name) in SILENT
        return
    (warning,) = caught
    assert warning.category is DeprecationWarning and warning.filename == __file__
    spelling = SPELLING.fullmatch(str(warning.message))
    if spelling is not None:  # a function that does what it did: the new call is on a face
        assert spelling["old"] == f"{module}.{name}" and callable(value)
        home, _, new = spelling["new"].rpartition(".")
        assert new in importlib.import_module(home).__all__
        return
    moved = MOVED.fullmatch(str(warning.message))
    assert moved is not None and moved["old"] == f"{module}.{name}", str(warning.message)
    if isinstance(value, types.ModuleType):  # a gone module: its names are walked as a face
        assert f"{module}.{name}" in NAMES
        return
    home, _, new = moved["new"].rpartition(".")
    assert new in importlib.import_module(home).__all__
    assert getattr(importlib.import_module(home), new) is value


@pytest.mark.parametrize(("module", "name"), sorted(REMOVED))
def test_the_changelog_names_each_removed_1_0_name(module, name):
    assert f"`{module}.{name}`" in CHANGELOG
