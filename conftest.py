"""Doctest namespace: every docstring example may use ``torch`` and ``sbfunc``."""

import pytest
import torch

import sbfunc

# Scripts that wrote test data with an older sbfunc (run against that release, not collected).
collect_ignore_glob = ["tests/data/*"]


@pytest.fixture(autouse=True)
def _doctest_namespace(doctest_namespace: dict) -> None:
    torch.manual_seed(0)
    doctest_namespace["torch"] = torch
    doctest_namespace["sbfunc"] = sbfunc


# The quick subset (`python -m pytest -m "not slow"`, about a minute on 2 cores) leaves out
# what compiles a step or starts processes (torch.compile tests, the examples, the
# distributed and kill/resume jobs), the docs pages and the statistical tests that draw
# thousands of selections. The full suite (what CI runs) includes everything.
SLOW = (
    "compile",
    "test_docs_python_blocks_run",
    "sequential_sampler",
    "unbiased",
    "likelier",
    "expected_kept_count",
    "stationary_kept_fraction",
    "is_uniform",
    "positions_are_uniform",
    "mixup_coefficient",
    "tests/distributed/",
    "tests/test_examples.py",
    "tests/algorithms/test_devices.py",
    "test_kill_resume.py",
    "test_resume.py",
    "test_checkpoint_atomic.py",
    "tests/step/test_transformers.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(s in item.nodeid for s in SLOW):
            item.add_marker(pytest.mark.slow)
        if "compile" in item.nodeid:  # the torch matrix runs -m "not slow or compile" (noxfile)
            item.add_marker(pytest.mark.compile)
