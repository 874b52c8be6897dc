"""Doctest namespace: every docstring example may use ``torch`` and ``sbfunc``."""

import pytest
import torch

import sbfunc


@pytest.fixture(autouse=True)
def _doctest_namespace(doctest_namespace: dict) -> None:
    torch.manual_seed(0)
    doctest_namespace["torch"] = torch
    doctest_namespace["sbfunc"] = sbfunc
