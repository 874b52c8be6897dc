"""DivBS's greedy selection (``sbfunc.policies.divbs_indices``): against a reference on
explicit gradient vectors, its invariants (clusters, duplicates, shapes, keys) and the meta
device."""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sbfunc import random as sbrandom
from sbfunc.policies import divbs_indices, gradient_gram, last_layer_errors
from tests.meta import META, empty

common = settings(max_examples=40, deadline=None, derandomize=True, database=None)
seeds = st.integers(0, 2**16)


def _problem(seed: int, n: int, c: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Errors from random logits and targets, and random features, in float64."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, c, generator=gen, dtype=torch.float64) * 2
    targets = torch.randint(0, c, (n,), generator=gen)
    return last_layer_errors(logits, targets), torch.randn(
        n, d, generator=gen, dtype=torch.float64
    )


def _embeddings(errors: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """The explicit last-layer gradients ``errors_i outer features_i``, flattened."""
    return torch.einsum("nc,nd->ncd", errors, features).reshape(errors.shape[0], -1)


def _reference_path(vectors: torch.Tensor, k: int) -> tuple[list[int], float, float]:
    """The greedy on explicit vectors: keep the row of largest ``|<g_i, r>|``, project the
    residual off the kept rows' span (an orthonormal basis by QR). Also returns how clearly
    each pick led (the smallest relative gap to the runner-up) and the smallest ``||r||^2``
    a pick was made at."""
    total, kept = vectors.sum(0), []
    residual, gap, least = total, torch.inf, torch.inf
    for _ in range(k):
        score = (vectors @ residual).abs()
        score[kept] = -torch.inf
        top = torch.topk(score, min(2, score.shape[0])).values
        if top.shape[0] == 2 and bool(torch.isfinite(top[1])):
            gap = min(gap, float((top[0] - top[1]) / top[0]))
        least = min(least, float(residual @ residual))
        kept.append(int(score.argmax()))
        basis = torch.linalg.qr(vectors[kept].T).Q
        residual = total - basis @ (basis.T @ total)
    return kept, gap, least


def _reference(vectors: torch.Tensor, k: int) -> list[int]:
    return sorted(_reference_path(vectors, k)[0])


@common
@given(seeds, st.integers(2, 10), st.data())
def test_matches_the_reference_on_explicit_vectors(seed, n, data):
    errors, features = _problem(seed, n, 4, 5)  # the embeddings span 15 > n dimensions
    k = data.draw(st.integers(1, n - 1))
    got = divbs_indices(gradient_gram(errors, features), k)
    assert got.tolist() == _reference(_embeddings(errors, features), k)


@common
@given(seeds, st.integers(1, 6), st.integers(1, 5), st.integers(0, 2**16))
def test_keeps_one_row_of_each_cluster(seed, clusters, copies, key_seed):
    gen = torch.Generator().manual_seed(seed)
    scale = torch.rand(clusters, 1, generator=gen) * 1.5 + 0.5  # distinct norms
    centres = torch.linalg.qr(torch.randn(8, clusters, generator=gen)).Q.T * scale
    rows = centres.repeat_interleave(copies, 0)
    rows = rows + 1e-4 * torch.randn(rows.shape, generator=gen)
    order = torch.randperm(rows.shape[0], generator=gen)
    errors = torch.rand(rows.shape[0], 3, generator=gen) + 0.5  # a common direction
    errors = errors[:, :1].expand(-1, 3)
    gram = gradient_gram(errors, rows[order])
    got = divbs_indices(gram, clusters, key=sbrandom.key(key_seed))
    cluster_of = torch.arange(clusters).repeat_interleave(copies)[order]
    assert sorted(cluster_of[got].tolist()) == list(range(clusters))


@common
@given(seeds, st.integers(1, 7), st.data())
def test_a_duplicate_waits_for_every_independent_row(seed, n, data):
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(n, 8, generator=gen, dtype=torch.float64)
    twin = data.draw(st.integers(0, n - 1))
    features = torch.cat([features, features[twin : twin + 1]])  # row n copies row twin
    key = sbrandom.key(data.draw(seeds))
    got = divbs_indices(gradient_gram(torch.ones(n + 1, 1), features), n, key=key).tolist()
    assert not (twin in got and n in got)


def test_a_duplicate_waits_once_the_sum_is_covered():
    # rows e1, e1 (a copy), e2, e3 - e2: the sum 2 e1 + e3 is covered by rows 0 and 3, then
    # row 2 still adds a direction, the copy does not: a random fill would pick it half the time
    h = torch.tensor([[1.0, 0, 0], [1.0, 0, 0], [0, 1.0, 0], [0, -1.0, 1.0]])
    gram = gradient_gram(torch.ones(4, 1), h)
    for seed in range(20):
        assert divbs_indices(gram, 3, key=sbrandom.key(seed)).tolist() in ([0, 2, 3], [1, 2, 3])
    assert divbs_indices(gram, 3).tolist() == [0, 2, 3]


def test_float32_follows_the_greedy_down_to_rounding_level():
    # rows 0 and 1 carry almost all of the sum; after them the residual is 0.022 (1.1e-4 of
    # ||sum g||^2, 1.05% of its norm): the greedy's next pick, row 6, leads clearly, and
    # float32 resolves it (a sqrt(eps) cut-off called the sum covered and filled at random)
    v = torch.zeros(7, 7)
    v[0, 0] = v[1, 1] = 10.0
    for i, s in enumerate([0.02, 0.04, 0.06, 0.08, 0.10]):
        v[2 + i, 2 + i] = s
    gram = v @ v.T
    assert divbs_indices(gram.double(), 3).tolist() == [0, 1, 6]
    assert divbs_indices(gram, 3).tolist() == [0, 1, 6]
    for seed in range(20):
        assert divbs_indices(gram, 3, key=sbrandom.key(seed)).tolist() == [0, 1, 6]


@common
@given(seeds, st.integers(2, 10), st.data())
def test_float32_picks_the_rows_float64_picks(seed, n, data):
    # well-conditioned rows (random directions in 3n dimensions) with norms over decades, so
    # that the residual gets small; each pick leads clearly (a relative gap over 1e-3, well
    # above float32's near-tie band) and is made while ||r||^2 is well above float32's
    # rounding level: then float32 and float64 keep the same rows, whatever the key
    gen = torch.Generator().manual_seed(seed)
    directions = torch.randn(n, 3 * n, generator=gen, dtype=torch.float64)
    scales = 10.0 ** (3.0 * torch.rand(n, 1, generator=gen, dtype=torch.float64) - 2.0)
    vectors = directions / directions.norm(dim=1, keepdim=True) * scales
    gram, k = vectors @ vectors.T, data.draw(st.integers(1, n - 1))
    kept, gap, least = _reference_path(vectors, k)
    scale = float(gram.sum() + gram.trace())
    assume(gap > 1e-3 and least > 512 * torch.finfo(torch.float32).eps * scale)
    key = sbrandom.key(data.draw(seeds))
    assert divbs_indices(gram.float(), k, key=key).tolist() == sorted(kept)
    assert divbs_indices(gram, k, key=key).tolist() == sorted(kept)


@common
@given(st.integers(1, 12), st.data(), st.sampled_from([torch.float32, torch.float64]))
def test_returns_k_distinct_sorted_indices(n, data, dtype):
    k = data.draw(st.integers(1, n))
    errors, features = _problem(data.draw(seeds), n, 3, data.draw(st.integers(1, 4)))
    for gram in (gradient_gram(errors, features).to(dtype), torch.zeros(n, n, dtype=dtype)):
        got = divbs_indices(gram, k, key=sbrandom.key(data.draw(seeds)))
        assert got.dtype == torch.int64 and got.shape == (k,)
        assert bool((got[1:] > got[:-1]).all()) and int(got[0]) >= 0 and int(got[-1]) < n


@common
@given(st.integers(1, 12), st.data())
def test_the_key_decides_among_zero_features(n, data):
    k, key = data.draw(st.integers(1, n)), sbrandom.key(data.draw(seeds))
    gram = torch.zeros(n, n)
    expected = torch.sort(torch.topk(sbrandom.uniform(key, (n,)), k).indices).values
    assert torch.equal(divbs_indices(gram, k, key=key), expected)
    assert divbs_indices(gram, k).tolist() == list(range(k))  # no key: lowest index first


@common
@given(seeds, st.integers(1, 12), st.data())
def test_same_key_same_result(seed, n, data):
    errors, features = _problem(seed, n, 3, 2)  # rank 4: the sum is soon covered
    gram, k = gradient_gram(errors, features), data.draw(st.integers(1, n))
    key = sbrandom.key(data.draw(seeds))
    assert torch.equal(divbs_indices(gram, k, key=key), divbs_indices(gram, k, key=key))


@common
@given(seeds, st.integers(1, 10), st.integers(1, 5), st.integers(1, 6))
def test_gradient_gram_is_the_embeddings_gram(seed, n, c, d):
    errors, features = _problem(seed, n, c, d)
    vectors = _embeddings(errors, features)
    assert torch.allclose(gradient_gram(errors, features), vectors @ vectors.T)


def test_last_layer_errors_is_the_logit_gradient():
    logits, targets = (
        torch.randn(5, 4, dtype=torch.float64, requires_grad=True),
        torch.arange(5) % 4,
    )
    torch.nn.functional.cross_entropy(logits, targets, reduction="sum").backward()
    assert torch.allclose(last_layer_errors(logits.detach(), targets), logits.grad)
    half = last_layer_errors(torch.zeros(2, 3, dtype=torch.bfloat16), torch.tensor([0, 2]))
    assert half.dtype == torch.float32


def test_a_non_finite_row_only_fills():
    errors, features = _problem(0, 6, 3, 4)
    gram = gradient_gram(errors, features)
    gram[2, :] = gram[:, 2] = torch.nan  # a NaN feature of row 2
    assert 2 not in divbs_indices(gram, 5).tolist()
    assert divbs_indices(gram, 6).tolist() == list(range(6))


def test_runs_on_the_meta_device_without_a_host_read():
    n, k = 10, 4
    gram = gradient_gram(last_layer_errors(empty(n, 3), empty(n, dtype=torch.int64)), empty(n, 5))
    for key in (None, sbrandom.key(0).to(META)):
        got = divbs_indices(gram, k, key=key)
        assert got.device == META and got.shape == (k,) and got.dtype == torch.int64


@pytest.mark.parametrize(
    ("gram", "k", "key", "error", "match"),
    [
        (torch.zeros(3), 1, None, ValueError, "gram must be a 2-D"),
        (torch.zeros(3, 2), 1, None, ValueError, "gram must be a square"),
        (torch.zeros(3, 3, dtype=torch.int64), 1, None, TypeError, "gram must be a 2-D floating"),
        ([[0.0]], 1, None, TypeError, "gram must be"),
        (torch.zeros(3, 3), 0, None, ValueError, r"k must be an int in \[1, 3\]"),
        (torch.zeros(3, 3), 4, None, ValueError, r"k must be an int .*N=3"),
        (torch.zeros(3, 3), 2.0, None, TypeError, "k must be an int"),
        (torch.zeros(3, 3), True, None, TypeError, "k must be an int"),
        (torch.zeros(3, 3), 1, 0, TypeError, "key"),
    ],
)
def test_bad_arguments_raise_naming_them(gram, k, key, error, match):
    with pytest.raises(error, match=match):
        divbs_indices(gram, k, key=key)


def test_bad_inputs_of_the_gram_and_the_errors_raise():
    with pytest.raises(ValueError, match="features must be a 2-D floating tensor with 3 rows"):
        gradient_gram(torch.zeros(3, 2), torch.zeros(4, 2))
    with pytest.raises(TypeError, match="errors must be"):
        gradient_gram(torch.zeros(3, 2, dtype=torch.int64), torch.zeros(3, 2))
    with pytest.raises(TypeError, match="targets must be"):
        last_layer_errors(torch.zeros(3, 2), torch.zeros(3))
    with pytest.raises(ValueError, match="targets must be"):
        last_layer_errors(torch.zeros(3, 2), torch.zeros(4, dtype=torch.int64))
