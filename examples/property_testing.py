"""Property-test your own training code with hypothesis and ``sbfunc.testing``.

Unit tests check the examples you thought of; property tests check a rule on hundreds of
inputs that hypothesis draws (and shrinks to a minimal counterexample when the rule breaks).
sbfunc's pieces are pure functions of explicit inputs, so the rules are easy to state. This
script tests four pieces of *user* code the way sbfunc tests its own:

1. a custom ordering pass, registered into the default passes: the pipeline still returns a
   permutation, never mutates its input and keeps sample selection first on every event (and
   a buggy first version, whose counterexample hypothesis finds and prints);
2. a custom selection rule (top-k plus one exploratory row): exactly ``kept_count`` unique
   rows, sorted so the batch order is kept, the best rows always in, the same key giving the
   same rows, and only the ranks of the scores mattering;
3. pruning with ``sbfunc.batch.take`` on any pytree batch: every per-sample leaf keeps the same
   rows, metadata leaves pass through, the input is untouched;
4. ``SelectiveBackprop`` driven by that rule on drawn states (what ``apply`` sees): it keeps
   exactly ``kept_count`` rows of every leaf, aligned, counts the scoring forward, leaves its
   key alone and is pure.

In a test suite, put ``@settings(...)`` and ``@given(...)`` on the same functions and let
pytest collect them. Here ``main`` applies them itself and prints one line per property.

Run: ``python examples/property_testing.py`` (``--fast`` draws fewer examples; both take
seconds).
"""

from __future__ import annotations

import os

# A shared machine: busy-waiting OpenMP threads stall whenever another process holds a core.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import time
import warnings
from collections.abc import Callable, Sequence

import optree
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbfunc
from sbfunc import Algorithm, Event
from sbfunc.engine import DEFAULT_PASSES, MultipleLossInterpolationWarning, register_pass
from sbfunc.select import Selection
from sbfunc.testing import algorithm_lists, events, pytree_batches, states

# ---------------------------------------------------------------- the user's code under test


def interpolation_last_buggy(algorithms: Sequence[Algorithm], event: Event) -> list[Algorithm]:
    """First attempt: run loss-interpolating algorithms (MixUp...) after all the others."""
    return sbfunc.engine.sort_to_back(algorithms, lambda a: a.interpolate_loss)


def interpolation_last(algorithms: Sequence[Algorithm], event: Event) -> list[Algorithm]:
    """The fix: the same, but sample selectors stay where the default passes put them."""
    return sbfunc.engine.sort_to_back(
        algorithms, lambda a: a.interpolate_loss and not a.selects_samples
    )


def top_k_with_exploration(keep: float) -> sbfunc.policies.Policy:
    """A policy for ``sbfunc.SelectiveBackprop(policy=...)``: the ``k - 1`` highest scores plus
    one row drawn uniformly from the rest; ``k`` is ``sbfunc.select.kept_count(N, keep)``, ties
    are broken at random by the key."""
    return sbfunc.policies.stateless(lambda scores, key, ids: _explore(scores, keep, key))


def _explore(scores: torch.Tensor, keep: float, key: torch.Tensor) -> Selection:
    n = scores.shape[0]
    k = sbfunc.select.kept_count(n, keep)
    k_rank, k_explore = sbfunc.random.split(key)
    top = sbfunc.select.ranks(scores, key=k_rank) >= n - (k - 1)
    rest = torch.zeros(n, device=scores.device).masked_fill(top, float("-inf"))
    explore = sbfunc.select.gumbel_top_k(rest, 1, sbfunc.random.gumbel(k_explore, (n,)))
    indices = torch.cat([top.nonzero().flatten(), explore]).sort().values
    return Selection(indices)


def first_leaf_energy(params: dict, buffers: dict, batch: object) -> torch.Tensor:
    """A per-sample score for any batch ``sbfunc.testing`` draws: ``||first leaf row||^2``."""
    x = optree.tree_leaves(batch)[0]
    return x.flatten(1).square().sum(1) * params["weight"].sum()


# ---------------------------------------------------------------- helpers for the properties


def run_passes(passes: Sequence[Callable], algorithms: list, event: Event) -> list:
    out = list(algorithms)
    with warnings.catch_warnings():  # drawn lists often hold several loss-interpolating toys
        warnings.simplefilter("ignore", MultipleLossInterpolationWarning)
        for p in passes:
            out = p(out, event)
    return out


def per_sample_leaves(batch: object) -> list[torch.Tensor]:
    """The leaves that ``take`` prunes: tensors with a leading (sample) dimension."""
    return [x for x in optree.tree_leaves(batch) if isinstance(x, torch.Tensor) and x.ndim > 0]


def clone_tree(tree: object) -> object:
    return optree.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, tree)


def trees_equal(a: object, b: object) -> bool:
    la, ta = optree.tree_flatten(a)
    lb, tb = optree.tree_flatten(b)
    same = [
        torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
        for x, y in zip(la, lb, strict=True)
    ]
    return ta == tb and all(same)


def assert_rows_aligned(original: object, kept: object) -> None:
    """Each kept row is one original row in *every* per-sample leaf, in batch order."""
    leaves, kept_leaves = per_sample_leaves(original), per_sample_leaves(kept)
    first = leaves[0].flatten(1)
    origin = []
    for row in kept_leaves[0].flatten(1):
        matches = (first == row).all(1).nonzero().flatten()
        assert matches.numel() >= 1, "a kept row is not a row of the original batch"
        origin.append(int(matches[0]))
    assert origin == sorted(origin), "kept rows are not in batch order"
    for leaf, kept_leaf in zip(leaves, kept_leaves, strict=True):
        assert torch.equal(leaf[origin], kept_leaf), "leaves disagree on which rows were kept"


# ---------------------------------------------------------------- the properties


def pipeline_keeps_selection_first(passes: Sequence[Callable]) -> Callable:
    def prop(algorithms: list, event: Event) -> None:
        before = list(algorithms)
        out = run_passes(passes, algorithms, event)
        assert algorithms == before, "a pass mutated its input"
        assert sorted(map(id, out)) == sorted(map(id, algorithms)), "not a permutation"
        rest = [a for a in out if not a.changes_sequence_length]  # those go first of all
        flags = [a.selects_samples for a in rest]
        assert flags == sorted(flags, reverse=True), f"a sample selector runs late: {out}"

    return prop


def selection_rules(values: list[int], keep: float, seed: int) -> None:
    scores = torch.tensor(values, dtype=torch.float32)  # small ints: ties are common
    key, policy = sbfunc.random.key(seed), top_k_with_exploration(keep)

    def top_k_with_exploration_of(scores: torch.Tensor) -> Selection:
        return policy.select(scores, policy.init(), key=key)[0]

    sel = top_k_with_exploration_of(scores)
    n, k = len(values), sbfunc.select.kept_count(len(values), keep)
    idx = sel.indices.tolist()
    assert len(idx) == k, f"kept {len(idx)} rows, kept_count is {k}"
    assert idx == sorted(set(idx)) and all(0 <= i < n for i in idx), "not unique, sorted, in range"
    kept_scores = sorted((values[i] for i in idx), reverse=True)[: k - 1]
    assert kept_scores == sorted(values, reverse=True)[: k - 1], "a top row was left out"
    again = top_k_with_exploration_of(scores)
    assert torch.equal(again.indices, sel.indices), "same key, different rows"
    shifted = top_k_with_exploration_of(2 * scores + 1)  # strictly increasing map
    assert torch.equal(shifted.indices, sel.indices), "depends on more than the ranks"


def take_keeps_leaves_aligned(batch: object, data: st.DataObject) -> None:
    n = sbfunc.batch.batch_size(batch)
    indices = data.draw(st.lists(st.integers(0, n - 1), unique=True).map(sorted))
    before = clone_tree(batch)
    kept = sbfunc.batch.take(batch, torch.tensor(indices, dtype=torch.int64))
    assert trees_equal(batch, before), "take mutated its input"
    assert optree.tree_structure(kept) == optree.tree_structure(batch)
    for leaf, kept_leaf in zip(optree.tree_leaves(batch), optree.tree_leaves(kept), strict=True):
        if isinstance(leaf, torch.Tensor) and leaf.ndim > 0:
            assert torch.equal(kept_leaf, leaf[indices])
        else:
            assert kept_leaf is leaf or kept_leaf == leaf, "a metadata leaf changed"


def selective_backprop_prunes_every_leaf(state: sbfunc.Context, keep: float) -> None:
    sb = sbfunc.SelectiveBackprop(
        start=0.0,
        end=1.0,
        interrupt=0,
        policy=top_k_with_exploration(keep),
        scoring=sbfunc.score.Scoring(loss_fn=first_leaf_energy),
    )
    before = clone_tree(state)
    new = sb.apply(Event.AFTER_DATALOADER, state)
    assert trees_equal(state, before), "apply mutated the state it was given"
    n = sbfunc.batch.batch_size(state.batch)
    assert sbfunc.batch.batch_size(new.batch) == sbfunc.select.kept_count(n, keep)
    assert_rows_aligned(state.batch, new.batch)
    assert new.samples_scored == state.samples_scored + n, "the scoring forward was not counted"
    assert torch.equal(new.key, state.key), "apply stored a key (draw from state.key, keep none)"
    assert trees_equal(sb.apply(Event.AFTER_DATALOADER, state), new), "not deterministic"


# ---------------------------------------------------------------- running them


def check(name: str, prop: Callable, strategies: tuple, examples: int) -> str | None:
    """Run one property; return the failure message, or None when it holds."""
    test = settings(max_examples=examples, derandomize=True, database=None, deadline=None)(
        given(*strategies)(prop)
    )
    t0 = time.perf_counter()
    try:
        test()
    except AssertionError as error:
        return str(error).splitlines()[0]
    print(f"  ok    {name:<58} {examples:>4} examples {time.perf_counter() - t0:5.1f} s")
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="fewer examples per property")
    args = parser.parse_args()
    n = 25 if args.fast else 200
    keeps = st.floats(0.05, 1.0)

    print("1. a buggy pass: hypothesis should find a counterexample")
    buggy = pipeline_keeps_selection_first(register_pass(DEFAULT_PASSES, interpolation_last_buggy))
    found = check("buggy pass", buggy, (algorithm_lists(), events()), n)
    if found is None:
        raise SystemExit("expected the buggy pass to fail its property")
    print(f"  found {found}")

    properties = [
        (
            "the fixed pass keeps sample selection first",
            pipeline_keeps_selection_first(register_pass(DEFAULT_PASSES, interpolation_last)),
            (algorithm_lists(), events()),
        ),
        (
            "top_k_with_exploration: count, order, top rows, key, ranks",
            selection_rules,
            (st.lists(st.integers(0, 5), min_size=1, max_size=40), keeps, st.integers(0, 2**32)),
        ),
        (
            "take keeps every leaf aligned",
            take_keeps_leaves_aligned,
            (pytree_batches(), st.data()),
        ),
        (
            "SelectiveBackprop(policy=...) prunes every leaf, purely",
            selective_backprop_prunes_every_leaf,
            (states(), keeps),
        ),
    ]
    print("2. the properties of the user code")
    failures = []
    for name, prop, strats in properties:
        message = check(name, prop, strats, n)
        if message is not None:
            print(f"  FAIL  {name}: {message}")
            failures.append(name)
    if failures:
        raise SystemExit(f"properties failed: {failures}")
    print("all properties hold")


if __name__ == "__main__":
    main()
