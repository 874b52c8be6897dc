"""sbfunc.checkpoint: round trips, template checks with readable diffs, integrity, versions.

Atomic saves are tested in test_checkpoint_atomic.py.
"""

import io
import itertools
import re
import warnings
from typing import NamedTuple

import optree
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn

import sbfunc
from sbfunc import checkpoint
from sbfunc.checkpoint import CheckpointError
from sbfunc.testing import states
from tests.helpers import assert_identical

SETTINGS = settings(max_examples=40, derandomize=True, database=None, deadline=None)


class Pair(NamedTuple):
    first: object
    second: object


DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.uint8, torch.bool]


@st.composite
def tensors(draw):
    shape = draw(st.lists(st.integers(0, 3), max_size=3))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    t = (torch.randn(shape, generator=g) * 5).to(draw(st.sampled_from(DTYPES)))
    return t.transpose(0, 1) if t.dim() >= 2 and draw(st.booleans()) else t  # non-contiguous


LEAVES = st.one_of(
    tensors(),
    st.integers(-(2**70), 2**70),
    st.floats(),  # nan and inf included
    st.booleans(),
    st.text(max_size=4),
    st.none(),
)
TREES = st.recursive(
    LEAVES,
    lambda kids: st.one_of(
        st.lists(kids, max_size=3),
        st.lists(kids, max_size=3).map(tuple),
        st.dictionaries(st.text("ab.'0", max_size=3), kids, max_size=3),
        st.builds(Pair, kids, kids),
    ),
    max_leaves=8,
)


def template_of(tree):
    """Same structure and leaf types, other values (the template's values are ignored)."""
    return optree.tree_map(
        lambda x: torch.zeros_like(x) if isinstance(x, torch.Tensor) else x,
        tree,
        none_is_leaf=True,
    )


def saved(tree):
    buf = io.BytesIO()
    checkpoint.save(tree, buf)
    return buf.getvalue()


def load_bytes(data, like):
    return checkpoint.load(io.BytesIO(data), like=like)


def paths(tree):
    """Each leaf's path as the messages print it (optree accessors, top-level fields bare)."""
    accessors, _, _ = optree.tree_flatten_with_accessor(tree, none_is_leaf=True)
    return [a.codify("").removeprefix(".") or "<root>" for a in accessors]


def model_state(*sizes, dtype=torch.float32):
    layers = [nn.Linear(a, b) for a, b in itertools.pairwise(sizes)]
    model = nn.Sequential(*[m for layer in layers for m in (layer, nn.ReLU())][:-1]).to(dtype)
    params, buffers = sbfunc.split_module(model, clone=True)
    opt_state = sbfunc.optim.adam(1e-3).init(params)
    return sbfunc.TrainState(params, buffers, sbfunc.random.key(0), opt_state=opt_state)


def error(data, like):
    with pytest.raises(CheckpointError) as info:
        load_bytes(data, like)
    return str(info.value)


def test_both_import_forms_give_the_module():
    import sbfunc.checkpoint as by_path

    assert by_path is checkpoint is sbfunc.checkpoint
    assert issubclass(CheckpointError, ValueError)


@SETTINGS
@given(TREES)
def test_round_trip_of_any_pytree(tree):
    assert_identical(load_bytes(saved(tree), template_of(tree)), tree)
    d = torch.load(io.BytesIO(saved(tree)), weights_only=True)  # plain data only
    assert_identical(checkpoint.from_state_dict(d, template_of(tree)), tree)


@SETTINGS
@given(states())
def test_round_trip_of_train_states(state):
    back = load_bytes(saved(state), template_of(state))
    assert type(back) is type(state) and type(back.time) is type(state.time)
    assert_identical(back, state)


@SETTINGS
@given(TREES, st.data())
def test_a_template_with_one_other_leaf_is_refused_naming_it(tree, data):
    leaves, spec = optree.tree_flatten(tree, none_is_leaf=True)
    assume(leaves)
    i = data.draw(st.integers(0, len(leaves) - 1))
    leaf = leaves[i]
    if isinstance(leaf, torch.Tensor):
        other = data.draw(
            st.sampled_from(
                [
                    leaf.unsqueeze(0).expand(2, *leaf.shape),  # another rank
                    leaf.to(torch.complex64),  # another dtype
                    leaf.shape[0] if leaf.dim() else 0,  # not a tensor
                ]
            )
        )
    else:
        other = data.draw(st.sampled_from([torch.zeros(1), 1j, b"", ()]))
    if isinstance(other, tuple):
        other = (leaf,)  # a node where the checkpoint has a leaf: a structure difference
    like = optree.tree_unflatten(spec, [*leaves[:i], other, *leaves[i + 1 :]])
    message = error(saved(tree), like)
    path = paths(tree)[i]
    if isinstance(other, tuple):
        assert "structure does not match" in message
        assert f"{path}: leaf in the checkpoint, tuple in the template" in message
    else:
        assert "1 leaf does not match the template" in message and f"\n  {path}: " in message


def test_wider_checkpoint_into_narrower_template_lists_the_extra_parameters():
    message = error(saved(model_state(3, 4, 2)), model_state(3, 4))
    assert "structure does not match the template `like` (6 differences)" in message
    for path in ["params['2.weight']", "params['2.bias']", "opt_state.exp_avg['2.bias']"]:
        assert f"\n  {path}: missing from the template" in message
    assert "PyTreeSpec" not in message  # a diff, not two tree reprs


def test_narrower_checkpoint_into_wider_template_lists_the_missing_parameters():
    message = error(saved(model_state(3, 4)), model_state(3, 4, 2))
    assert "\n  params['2.weight']: missing from the checkpoint" in message
    assert "\n  opt_state.exp_avg_sq['2.weight']: missing from the checkpoint" in message


def test_node_type_differences_are_reported_once_at_the_top():
    ck = {"a": {"x": 1, "y": 2}, "b": [1, 2], "c": Pair(1, 2)}
    like = {"a": [1, 2], "b": (1, 2), "c": {"first": 1, "second": 2}, "d": {"z": 1}}
    lines = error(saved(ck), like).splitlines()[1:]
    assert lines == [
        "  ['a']: dict in the checkpoint, list in the template",
        "  ['b']: list in the checkpoint, tuple in the template",
        "  ['c']: Pair in the checkpoint, dict in the template",
        "  ['d']: missing from the checkpoint",
    ]


def test_wrong_shapes_and_dtypes_name_every_leaf_with_both_shapes_and_dtypes():
    message = error(saved(model_state(3, 4, 2)), model_state(3, 5, 2, dtype=torch.float64))
    assert message.startswith("checkpoint <BytesIO>: 12 leaves do not match the template")
    assert (
        "\n  params['0.weight']: float32 tensor of shape (4, 3) in the checkpoint, "
        "float64 tensor of shape (5, 3) in the template"
    ) in message
    assert "\n  opt_state.exp_avg_sq['2.weight']: float32 tensor of shape (2, 4)" in message
    message = error(saved(model_state(3, 4)), model_state(3, 5))
    assert (
        "\n  params['0.bias']: float32 tensor of shape (4,) in the checkpoint, float32 " in message
    )


def test_non_tensor_leaves_need_the_same_type_only():
    ck = {"step": 3, "lr": 0.5, "on": True, "name": "a", "w": 2, "n": None, "t": torch.ones(1)}
    like = {"step": 9, "lr": 0.1, "on": False, "name": "b", "w": torch.ones(1), "n": 0, "t": 1}
    lines = error(saved(ck), like).splitlines()[1:]
    assert lines == [
        "  ['n']: None in the checkpoint, int in the template",
        "  ['t']: float32 tensor of shape (1,) in the checkpoint, int in the template",
        "  ['w']: int in the checkpoint, float32 tensor of shape (1,) in the template",
    ]
    back = load_bytes(saved(ck), {**like, "w": 0, "n": None, "t": torch.zeros(1)})
    assert back["step"] == 3 and back["lr"] == 0.5 and back["name"] == "a" and back["on"]


def test_a_zero_size_template_dimension_matches_any_size_and_nothing_else():
    q = sbfunc.selective_backprop.enqueue(
        sbfunc.selective_backprop.empty_queue({"x": torch.zeros(1, 3)}), {"x": torch.ones(5, 3)}
    )
    back = load_bytes(saved(q), sbfunc.selective_backprop.empty_queue({"x": torch.zeros(1, 3)}))
    assert torch.equal(back.rows["x"], torch.ones(5, 3))
    assert "shape (5, 3) in the checkpoint, float32 tensor of shape (0,)" in error(
        saved(q), sbfunc.selective_backprop.Queue({"x": torch.zeros(0)})
    )
    assert "(0, 3) in the checkpoint" in error(
        saved({"x": torch.zeros(0, 3)}), {"x": torch.ones(2, 3)}
    )


def test_mismatches_are_all_counted_and_listed_up_to_twenty():
    message = error(saved([torch.zeros(2)] * 30), [torch.zeros(3)] * 30)
    assert message.startswith("checkpoint <BytesIO>: 30 leaves do not match")
    assert "\n  [19]: " in message and "\n  [20]: " not in message
    assert message.endswith("\n  ... and 10 more")


def test_state_of_another_structure_is_refused(tmp_path):  # moved from tests/step/test_resume
    from tests.step import resume_job

    checkpoint.save(resume_job.template(), tmp_path / "s.pt")
    other = sbfunc.TrainState({}, {}, sbfunc.random.key(0))
    with pytest.raises(CheckpointError, match="structure does not match") as info:
        checkpoint.load(tmp_path / "s.pt", like=other)
    assert "\n  params['0.weight']: missing from the template" in str(info.value)
    assert "\n  algorithm_state[0]: missing from the template" in str(info.value)


STATE = {"params": {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(3)}, "step": 5}


def test_every_truncation_is_refused_naming_the_file(tmp_path):
    data, path = saved(STATE), tmp_path / "state.pt"
    for n in range(len(data)):
        with pytest.raises(
            CheckpointError, match="checkpoint <BytesIO> is unreadable \\(truncated, corrupt"
        ):
            load_bytes(data[:n], STATE)
    for n in range(0, len(data), 97):  # a sample through a real file: its name in the message
        path.write_bytes(data[:n])
        with pytest.raises(
            CheckpointError,
            match=re.escape(f"checkpoint {str(path)!r} is unreadable (truncated, corrupt"),
        ):
            checkpoint.load(path, like=STATE)
    path.write_bytes(data)
    assert_identical(checkpoint.load(str(path), like=STATE), STATE)


def test_a_flipped_byte_is_refused_or_harmless_never_a_wrong_load(tmp_path):
    data, refused = saved(STATE), set()
    tensor_bytes = data.index(torch.arange(6.0).numpy().tobytes())
    positions = [*range(0, len(data), 5), *range(tensor_bytes, tensor_bytes + 24)]
    for i in positions:
        flipped = bytearray(data)
        flipped[i] ^= 0x10
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch warns about odd pickle protocols
                back = load_bytes(bytes(flipped), STATE)
        except CheckpointError as e:
            assert str(e).startswith("checkpoint <BytesIO> is ")
            refused.add(i)
        else:  # a byte torch never reads (zip padding, the archive's id)
            assert_identical(back, STATE)
    assert set(range(tensor_bytes, tensor_bytes + 24)) <= refused
    assert len(refused) > len(positions) // 3
    path = tmp_path / "state.pt"
    path.write_bytes(data[:tensor_bytes] + b"\xff" + data[tensor_bytes + 1 :])
    with pytest.raises(CheckpointError, match=re.escape(f"checkpoint {str(path)!r} is corrupt: ")):
        checkpoint.load(path, like=STATE)


def test_the_digest_covers_leaves_and_structure():
    d = checkpoint.to_state_dict(STATE)
    for key, value in [
        ("leaves", [torch.ones(3), torch.arange(6.0).reshape(3, 2), 5]),
        ("leaves", [torch.ones(3), torch.arange(6.0).reshape(2, 3), True]),
        ("structure", d["structure"].replace("'w'", "'v'")),
        ("nodes", d["nodes"][:-1]),
    ]:
        with pytest.raises(CheckpointError, match=r"<state dict> is corrupt: .* sha256 digest"):
            checkpoint.from_state_dict({**d, key: value}, STATE)
    with pytest.raises(CheckpointError, match="its 'digest' is missing"):
        checkpoint.from_state_dict({k: v for k, v in d.items() if k != "digest"}, STATE)


def test_other_files_are_not_sbfunc_checkpoints(tmp_path):
    for obj, got in [({"a": 1}, "format None"), (torch.ones(2), "a Tensor")]:
        torch.save(obj, tmp_path / "x.pt")
        with pytest.raises(CheckpointError, match=f"'.*x.pt' is not an sbfunc .*got {got}"):
            checkpoint.load(tmp_path / "x.pt", like={})
    with pytest.raises(FileNotFoundError):
        checkpoint.load(tmp_path / "missing.pt", like={})
    with pytest.raises(TypeError, match="f must be a path or a readable binary file, got int"):
        checkpoint.load(3, like={})
    with pytest.raises(TypeError, match="f must be a path or a writable binary file, got int"):
        checkpoint.save({}, 3)


def test_version_1_files_load_with_a_warning(tmp_path):
    leaves, spec = optree.tree_flatten(STATE, none_is_leaf=True)
    torch.save(
        {"format": "sbfunc.checkpoint/1", "structure": str(spec), "leaves": leaves},
        tmp_path / "v1.pt",
    )
    with pytest.warns(UserWarning, match="'sbfunc.checkpoint/1': it has no digest"):
        assert_identical(checkpoint.load(tmp_path / "v1.pt", like=STATE), STATE)
    with pytest.warns(UserWarning), pytest.raises(CheckpointError, match="checkpoint: PyTreeSpec"):
        checkpoint.load(tmp_path / "v1.pt", like={**STATE, "extra": 1})
    with pytest.warns(UserWarning), pytest.raises(CheckpointError, match="1 leaf does not"):
        checkpoint.load(tmp_path / "v1.pt", like={**STATE, "step": 5.0})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_round_trip_and_map_to_the_cpu():
    tree = {"w": torch.randn(3, 2, device="cuda"), "step": 1}
    data = saved(tree)
    assert load_bytes(data, tree)["w"].device.type == "cuda"
    back = checkpoint.load(io.BytesIO(data), like=tree, map_location="cpu")
    assert back["w"].device.type == "cpu" and torch.equal(back["w"], tree["w"].cpu())
