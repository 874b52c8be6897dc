import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sbfunc.distributed import batch_rows, pack_rows, unpack_rows, with_rows

DTYPES = [torch.float32, torch.float64, torch.int64, torch.int32, torch.bool, torch.bfloat16]


@settings(max_examples=60, derandomize=True, database=None, deadline=None)
@given(
    n=st.integers(0, 5),
    specs=st.lists(
        st.tuples(st.sampled_from(DTYPES), st.lists(st.integers(0, 3), max_size=2)),
        min_size=1,
        max_size=4,
    ),
    seed=st.integers(0, 2**16),
)
def test_pack_then_unpack_is_the_identity_bit_for_bit(n, specs, seed):
    g = torch.Generator().manual_seed(seed)
    tensors = [(torch.randn((n, *shape), generator=g) * 100).to(dtype) for dtype, shape in specs]
    packed, layout = pack_rows(tensors)
    assert packed.dtype == torch.uint8 and packed.shape == (n, layout.row_bytes)
    for i in range(n):  # row i of the packed matrix holds exactly row i of every tensor
        one, _ = pack_rows([t[i : i + 1] for t in tensors])
        assert torch.equal(packed[i : i + 1], one)
    for a, b in zip(unpack_rows(packed, layout), tensors, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)


def test_rows_of_a_pytree_batch_round_trip():
    batch = {"x": torch.arange(6.0).reshape(3, 2), "meta": "train", "y": (torch.arange(3),)}
    rows = batch_rows(batch)
    assert [r.shape for r in rows] == [(3, 2), (3,)]
    half = with_rows(batch, [r[:1] for r in rows])
    assert half["meta"] == "train" and half["y"][0].tolist() == [0]
    assert torch.equal(half["x"], batch["x"][:1])


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="rank >= 1"):
        pack_rows([torch.tensor(1.0)])
    with pytest.raises(ValueError, match="disagree on the first axis"):
        pack_rows([torch.zeros(2), torch.zeros(3)])
    with pytest.raises(TypeError, match=r"batch\['text'\] is a per-sample list"):
        batch_rows({"x": torch.zeros(2), "text": ["a", "b"]})
