"""The torch matrix: sbfunc's quick tests and compile tests on every torch release it claims.

One session per release (``nox -l`` lists them)::

    pip install nox
    nox -s "tests(torch='2.11.0')"          # one release
    nox -s tests                            # every release, one after another
    nox -s report                           # docs/results/compatibility.md from the last runs

A session makes a virtual environment (in ``.nox/``, or under ``--envdir``), installs the exact
torch first and alone, then ``sbfunc[test]`` editable with the tools pinned by
``.ci/constraints.txt`` (less the packages torch itself pins: an old torch wants its own sympy),
and runs ``python -m pytest -m "not slow or compile"``: the quick subset and every test whose
id says ``compile``. Its counts (passed, failed, skipped, errors, wall time, date, the command)
go to ``.nox/results/torch-<version>.json``; ``report`` writes them as the page's table.

Environments made before can be reused: ``-r`` reuses a session's environment and reinstalls
sbfunc, ``-R`` also skips every install; ``--envdir DIR`` looks for them as
``DIR/tests-torch-2-11-0`` (nox's name for the session). Arguments after ``--`` replace the
pytest arguments, e.g. ``nox -s "tests(torch='2.11.0')" -- -n 0 -k compile``.

Every torch but CI's is a multi-GB download (the registry's wheels are CUDA builds; they run on
the CPU). The session's torch pin is the only constraint on torch: a pip constraint from the
environment (``PIP_CONSTRAINT``, a pip config file) would fight it, so the installs run with
``PIP_CONSTRAINT`` set to an empty file.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import nox

ROOT = Path(__file__).parent
RESULTS = ROOT / ".nox" / "results"
PAGE = ROOT / "docs" / "results" / "compatibility.md"
# The floor (pyproject.toml's requires), CI's pin and the newest release.
TORCH = ["2.11.0", "2.13.0", "2.15.0"]
PYTEST = ["-m", "not slow or compile", "-p", "no:cacheprovider"]
NO_CONSTRAINT = {"PIP_CONSTRAINT": os.devnull}
BEGIN, END = "<!-- matrix: written by `nox -s report` -->", "<!-- end of matrix -->"

nox.options.sessions = ["tests"]


def _name(requirement: str) -> str:
    """A requirement's or a pin's distribution name, normalised (PEP 503)."""
    head = re.split(r"[\s;<>=!~\[(]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", head).lower()


def _tool_pins(session: nox.Session) -> str:
    """``.ci/constraints.txt`` less the packages this session's torch requires."""
    code = "import importlib.metadata as m; print('\\n'.join(m.requires('torch') or []))"
    torch_needs = {_name(line) for line in _python(session, code).splitlines() if line.strip()}
    lines = (ROOT / ".ci" / "constraints.txt").read_text().splitlines()
    kept = [x for x in lines if x.strip() and not x.startswith("#")]
    path = Path(session.create_tmp()) / "tools.txt"
    path.write_text("\n".join(x for x in kept if _name(x) not in torch_needs) + "\n")
    return str(path)


def _python(session: nox.Session, code: str) -> str:
    """What ``code`` prints in the session's interpreter."""
    return str(session.run("python", "-c", code, silent=True) or "").strip()


def _counts(junit: Path) -> dict[str, int]:
    """Passed, failed, skipped and errors from pytest's JUnit XML."""
    root = ET.parse(junit).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    assert suite is not None, junit
    total, failed, skipped, errors = (
        int(suite.get(k, "0")) for k in ("tests", "failures", "skipped", "errors")
    )
    return {
        "passed": total - failed - skipped - errors,
        "failed": failed,
        "skipped": skipped,
        "errors": errors,
    }


@nox.session
@nox.parametrize("torch", TORCH)
def tests(session: nox.Session, torch: str) -> None:
    """The quick subset and the compile tests on one torch release."""
    session.install(f"torch=={torch}", env=NO_CONSTRAINT)  # first and alone: its own wheel
    pins = _tool_pins(session)
    session.install("-c", pins, "-e", ".[test]", f"torch=={torch}", env=NO_CONSTRAINT)
    build = _python(session, "import torch; print(torch.__version__)")
    python = _python(session, "import platform; print(platform.python_version())")
    RESULTS.mkdir(parents=True, exist_ok=True)
    junit = Path(session.create_tmp()) / "junit.xml"
    args = session.posargs or PYTEST
    command = ["python", "-m", "pytest", *args]
    start = time.monotonic()
    try:
        session.run(*command, f"--junitxml={junit}", env={"OMP_WAIT_POLICY": "PASSIVE"})
    finally:
        if junit.exists():
            result = {
                "torch": torch,
                "build": build,
                "python": python,
                **_counts(junit),
                "seconds": round(time.monotonic() - start),
                "date": datetime.date.today().isoformat(),
                "command": f"nox -s \"tests(torch='{torch}')\""
                + (" -- " + " ".join(session.posargs) if session.posargs else ""),
            }
            (RESULTS / f"torch-{torch}.json").write_text(json.dumps(result, indent=1) + "\n")


def _version_key(result: dict[str, object]) -> tuple[int, ...]:
    return tuple(int(p) for p in str(result["torch"]).split("."))


def _table(results: list[dict[str, object]]) -> str:
    head = (
        "| torch | build | passed | failed | errors | skipped | time | date | command |\n"
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |\n"
    )
    rows = []
    for r in sorted(results, key=_version_key):
        minutes = f"{int(r['seconds']) / 60:.1f} min"  # type: ignore[call-overload]
        rows.append(
            f"| {r['torch']} | {r['build']} | {r['passed']} | {r['failed']} | {r['errors']} | "
            f"{r['skipped']} | {minutes} | {r['date']} | `{r['command']}` |"
        )
    return head + "\n".join(rows) + "\n"


@nox.session(python=False)
def report(session: nox.Session) -> None:
    """Write the last result of every release into docs/results/compatibility.md's table."""
    results = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("torch-*.json"))]
    if not results:
        session.error(f"no results in {RESULTS}: run `nox -s tests` first")
    text = PAGE.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    PAGE.write_text(text[:start] + "\n" + _table(results) + text[end:])
    session.log(f"{PAGE.relative_to(ROOT)}: {len(results)} releases")


if __name__ == "__main__":
    sys.exit("run with nox: nox -s tests")
