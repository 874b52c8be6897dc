import pickle

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from sbfunc import random as sbrandom
from sbfunc.random import check_key
from tests.random.helpers import SETTINGS, tensor_path

seeds = st.integers(-(2**70), 2**70)
int64s = st.integers(-(2**63), 2**63 - 1)

# Reference values from jax 0.10.2 (jax.random.key_data; jax_threefry_partitionable=True, the
# default; the seeds above 2**32 and below 0 with jax_enable_x64).
JAX_KEYS = {0: [0, 0], 42: [0, 42], 2**40 + 123: [256, 123], -5: [4294967295, 4294967291]}
JAX_SPLIT_0 = [[1797259609, 2579123966], [928981903, 3453687069]]
JAX_SPLIT_42_3 = [[1832780943, 270669613], [64467757, 2916123636], [2465931498, 255383827]]
JAX_SPLIT_42_20 = {0: [1832780943, 270669613], 16: [93140584, 3012977499]}
JAX_SPLIT_42_20[19] = [4157746707, 817917514]
JAX_FOLD_IN = [
    (0, 1, [928981903, 3453687069]),
    (0, 4_000_000_000, [630905120, 2387907625]),
    (5, 0, [2724472204, 3573582090]),
    (5, 2**32 - 1, [3166336820, 3911873599]),
]


def test_key_matches_jax_threefry_seed():
    for seed, words in JAX_KEYS.items():
        k = sbrandom.key(seed)
        assert k.dtype == torch.int64 and k.shape == (2,)
        assert k.tolist() == words


@SETTINGS
@given(seeds)
def test_key_is_the_seed_mod_2_64_in_two_words(seed):
    k = sbrandom.key(seed)
    assert sbrandom.is_key(k)
    assert (k[0].item() << 32) | k[1].item() == seed % 2**64


def test_key_device_argument():
    assert sbrandom.key(1, device="meta").device.type == "meta"


def test_split_matches_jax():
    assert sbrandom.split(sbrandom.key(0)).tolist() == JAX_SPLIT_0
    assert sbrandom.split(sbrandom.key(42), 3).tolist() == JAX_SPLIT_42_3
    many = sbrandom.split(sbrandom.key(42), 20)  # the vectorised path
    assert {i: many[i].tolist() for i in JAX_SPLIT_42_20} == JAX_SPLIT_42_20


def test_split_of_split_and_chained_fold_in_match_jax():
    k = sbrandom.split(sbrandom.split(sbrandom.key(7), 5)[3], 2)
    assert k.tolist() == [[2785874591, 2637538571], [4073741833, 2748900490]]
    chained = sbrandom.fold_in(sbrandom.fold_in(sbrandom.key(123), 7), 2**32 - 1)
    assert chained.tolist() == [3407635046, 1802708380]


def test_fold_in_matches_jax():
    for seed, data, words in JAX_FOLD_IN:
        assert sbrandom.fold_in(sbrandom.key(seed), data).tolist() == words


@SETTINGS
@given(seeds, st.integers(1, 40))
def test_split_host_path_equals_tensor_path(seed, num):
    k = sbrandom.key(seed)
    host = sbrandom.split(k, num)
    with tensor_path():
        tensor = sbrandom.split(k, num)
    assert host.shape == (num, 2) and torch.equal(host, tensor)


@SETTINGS
@given(seeds, int64s)
def test_fold_in_host_int_tensor_paths_agree(seed, data):
    k = sbrandom.key(seed)
    host = sbrandom.fold_in(k, data)
    assert torch.equal(host, sbrandom.fold_in(k, torch.tensor(data)))
    assert torch.equal(host, sbrandom.fold_in(k, data + 2**64))  # data is taken mod 2**64
    with tensor_path():
        assert torch.equal(host, sbrandom.fold_in(k, data))
        assert torch.equal(host, sbrandom.fold_in(k, torch.tensor(data)))


def test_fold_in_accepts_small_integer_dtypes():
    k = sbrandom.key(3)
    for dtype in (torch.int32, torch.int16, torch.uint8):
        assert torch.equal(
            sbrandom.fold_in(k, torch.tensor(7, dtype=dtype)), sbrandom.fold_in(k, 7)
        )
    assert torch.equal(
        sbrandom.fold_in(k, torch.tensor(-1, dtype=torch.int32)), sbrandom.fold_in(k, -1)
    )


@SETTINGS
@given(seeds, st.integers(1, 8))
def test_split_children_are_distinct_and_reproducible(seed, num):
    k = sbrandom.key(seed)
    children = sbrandom.split(k, num)
    assert len({tuple(c.tolist()) for c in children} | {tuple(k.tolist())}) == num + 1
    assert torch.equal(children, sbrandom.split(k, num))
    a, *_ = sbrandom.split(k, num)
    assert sbrandom.is_key(a)


def test_no_collisions_over_thousands_of_derived_keys():
    k = sbrandom.key(0)
    folded = torch.stack([sbrandom.fold_in(k, i) for i in range(3000)])
    split = sbrandom.split(k, 5000)
    grandchildren = sbrandom.split(sbrandom.split(k, 1)[0], 3000)
    for keys in (folded, split, grandchildren):
        assert len({tuple(r) for r in keys.tolist()}) == keys.shape[0]
    assert ((split >= 0) & (split < 2**32)).all()


def test_fold_in_under_vmap_gives_per_sample_keys():
    k = sbrandom.key(9)
    batched = torch.func.vmap(lambda d: sbrandom.fold_in(k, d))(torch.arange(5))
    assert torch.equal(batched, torch.stack([sbrandom.fold_in(k, i) for i in range(5)]))
    keys = sbrandom.split(k, 3)
    split_each = torch.func.vmap(sbrandom.split)(keys)
    assert torch.equal(split_each, torch.stack([sbrandom.split(c) for c in keys]))


def test_derivation_does_not_mutate_parent():
    k = sbrandom.key(1)
    before = k.clone()
    sbrandom.split(k)
    sbrandom.fold_in(k, 3)
    sbrandom.uniform(k, (3,))
    assert torch.equal(k, before)


def test_key_checkpoints_with_weights_only(tmp_path):
    k = sbrandom.key(42)
    torch.save({"key": k}, tmp_path / "k.pt")
    loaded = torch.load(tmp_path / "k.pt", weights_only=True)["key"]
    assert torch.equal(loaded, k) and sbrandom.is_key(loaded)
    assert torch.equal(pickle.loads(pickle.dumps(k)), k)


@pytest.mark.parametrize(
    ("bad", "got"),
    [
        (3, "got 3"),
        (torch.tensor(1), "got a torch.int64 tensor of shape ()"),
        (torch.tensor([1.0, 2.0]), "got a torch.float32 tensor of shape (2,)"),
        (torch.tensor([1, 2], dtype=torch.int32), "got a torch.int32 tensor"),
        (torch.zeros(3, 2, dtype=torch.int64), "tensor of shape (3, 2)"),
    ],
)
def test_check_key_names_argument_expected_form_and_received(bad, got):
    assert not sbrandom.is_key(bad)
    with pytest.raises(TypeError, match=r"k must be an int64 tensor of shape \(2,\)") as info:
        sbrandom.split(bad)
    assert got in str(info.value)
    with pytest.raises(TypeError, match=r"^state\.key must be an int64 tensor of shape \(2,\)"):
        check_key(bad, "state.key")


def test_is_key_does_not_read_values():
    assert sbrandom.is_key(torch.empty(2, dtype=torch.int64, device="meta"))
    k = sbrandom.key(0)
    assert check_key(k) is k


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: sbrandom.key(1.0), TypeError, r"seed must be an int, got 1\.0; pass the int 1"),
        (lambda: sbrandom.key(True), TypeError, r"seed must be an int, got True \(a bool\)"),
        (lambda: sbrandom.split(sbrandom.key(0), 0), ValueError, "num must be an int >= 1, got 0"),
        (lambda: sbrandom.split(sbrandom.key(0), 2.0), TypeError, "num must be an int"),
        (lambda: sbrandom.fold_in(sbrandom.key(0), 1.5), TypeError, "data must be an int"),
        (
            lambda: sbrandom.fold_in(sbrandom.key(0), torch.tensor(1.0)),
            TypeError,
            r"data must be an int or an integer tensor, got a torch.float32 tensor of shape \(\)",
        ),
        (
            lambda: sbrandom.fold_in(sbrandom.key(0), torch.tensor([1, 2])),
            ValueError,
            r"data must be a 0-d tensor, got shape \(2,\)",
        ),
    ],
)
def test_argument_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()
