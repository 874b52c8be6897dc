"""``docs/concepts/transforms.md`` says exactly what the code has (issue 42, item 1): the
shapes its tables list are the types the code defines, one per concept, with the fields and
methods the page names; every surgery is a ``Surgery`` (``tests/algorithms/test_surgery.py``)
and every per-sample transform a ``PerSampleTransform`` (``tests/per_sample/test_one_shape.py``).
"""

import re
import typing
from pathlib import Path

import pytest
import torch

import sbfunc
from tests.test_readme import resolve

PAGE = (Path(__file__).resolve().parents[1] / "docs" / "concepts" / "transforms.md").read_text()
ROW = re.compile(
    r"^\| (?P<shape>[a-z -]+) \| `(?P<type>sbfunc[\w.]+)` \((?P<kind>[^)]*)\) \|", re.M
)
SHAPES = {
    "optimizer": "sbfunc.optim.GradientTransformation",
    "policy": "sbfunc.policies.Policy",
    "reference": "sbfunc.selective_backprop.Reference",
    "algorithm": "sbfunc.Algorithm",
    "surgery": "sbfunc.algorithms.Surgery",
    "per-sample transform": "sbfunc.per_sample.PerSampleTransform",
}


def _rows() -> dict[str, tuple[str, str]]:
    return {m["shape"]: (m["type"], m["kind"]) for m in ROW.finditer(PAGE)}


def test_the_page_lists_one_type_per_concept_and_the_code_defines_it():
    rows = _rows()
    assert {shape: t for shape, (t, _) in rows.items()} == SHAPES
    assert len(set(SHAPES.values())) == len(SHAPES)
    for name in SHAPES.values():
        assert isinstance(resolve(name), type), name
    assert "There are six, one per concept" in PAGE


def _named(kind: str) -> list[str]:
    return re.findall(r"`(\w+)`", kind.partition(":")[2])


def test_the_fields_and_methods_the_page_names_are_the_types_own():
    for shape, (name, kind) in _rows().items():
        cls = resolve(name)
        if kind.startswith("a NamedTuple"):
            assert list(cls._fields) == _named(kind), shape
        elif kind.startswith("a protocol"):
            assert getattr(cls, "_is_protocol", False), shape
            if _named(kind):
                members = {n for n in vars(cls) if not n.startswith("_")}
                assert members == set(_named(kind)), shape
        else:
            assert kind == "a frozen class", shape
            assert issubclass(cls, sbfunc.engine.Algorithm | sbfunc.algorithms.Surgery)


def test_the_shipped_references_are_references():
    sb = sbfunc.selective_backprop
    model = torch.nn.Linear(2, 2)
    loss_fn = sbfunc.per_sample_loss(model, sbfunc.module.next_token_cross_entropy)
    for ref in (sb.reference_field(), sb.reference_model(loss_fn, *sbfunc.split_module(model))):
        assert isinstance(ref, sb.Reference)
    assert typing.get_type_hints(sb.TokenSelection.__init__)["reference"] == sb.Reference | None
    with pytest.raises(TypeError, match=r"reference must be a Reference .* got ModuleLoss"):
        sb.TokenSelection(0.5, reference=loss_fn)  # the loss, not its reference_model(...)
