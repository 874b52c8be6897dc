"""The runs the distributed tests compare: the same training on ``WORLD`` gloo ranks (in
spawned processes, see ``job.py``) and in one process on the concatenated batches."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import optree
import torch
import torch.nn.functional as F
from torch import nn

import sbfunc
from sbfunc import distributed as sbdist
from sbfunc import random as sbrandom
from sbfunc.policies import Policy
from sbfunc.score import Signals
from sbfunc.select import Selection
from tests.helpers import split as chunked

WORLD, N, BATCH, EPOCHS = 2, 48, 8, 2  # 3 steps per epoch of 16 global rows
KEY = sbrandom.key(11)


def data() -> tuple[torch.Tensor, torch.Tensor]:
    x = sbrandom.normal(sbrandom.fold_in(KEY, 1), (N, 6))
    y = (x[:, :3].sum(1) > 0).long() + (x[:, 0] > 0.5).long()
    return x, y


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def _first_half(scores: torch.Tensor, key: Any, ids: Any) -> Selection:
    return Selection(torch.arange(scores.shape[0] // 2, device=scores.device))


def first_half() -> Policy:
    """A policy that keeps the first half of the rows: under a global selection every kept row
    sits on rank 0 and rank 1 backpropagates none."""
    return sbfunc.policies.stateless(_first_half)


def rank_power() -> Policy:
    return sbfunc.policies.rank_power(0.5)


def largest_logits(*, stateful: bool = False) -> Policy:
    """A policy that reads every signal: the half of the rows of largest logits norm (plus,
    when ``stateful``, their features' agreement with the sum of the features kept so far)."""

    def rule(scores: torch.Tensor, state: Any, a: sbfunc.policies.SelectArgs) -> Any:
        logits, features, targets = a.signals
        priority = logits.norm(dim=1) + 1e-3 * targets
        if stateful:
            priority = priority + 0.1 * (features @ state)
        top = torch.topk(priority, scores.shape[0] // 2).indices
        sel = Selection(torch.sort(top).values)
        return sel, (state + features[sel.indices].sum(0) if stateful else state)

    init = (lambda: torch.zeros(8)) if stateful else sbfunc.types.EmptyState
    return sbfunc.policies.make_policy(init, rule, needs=("logits", "features", "targets"))


class Scenario(NamedTuple):
    kind: str  # "global" or "local"
    rebalance: bool
    policy: Callable[[], Policy] = rank_power
    ids: bool = False  # read (and gather) the sample ids
    microbatch_size: int | None = None  # gradient accumulation over chunks of kept rows


SCENARIOS = {
    "global_rank_power": Scenario("global", False),
    "global_infobatch": Scenario(
        "global", False, lambda: sbfunc.policies.infobatch(0.5, num_ids=N), ids=True
    ),
    "global_jiang_rebalance": Scenario(
        "global",
        True,
        lambda: sbfunc.policies.jiang_cdf(1.0, history=32, reweight=True),
        ids=True,
    ),
    "global_rank_power_microbatched": Scenario("global", False, microbatch_size=3),
    "global_empty_rank": Scenario("global", False, first_half),
    "global_empty_rank_rebalance": Scenario("global", True, first_half),
    "global_signals_rebalance": Scenario("global", True, largest_logits),
    "local_rank_power": Scenario("local", False),
    "local_signals": Scenario("local", False, lambda: largest_logits(stateful=True)),
    "local_stale_sb": Scenario(
        "local",
        False,
        lambda: sbfunc.policies.stale_sb(1.0, num_ids=N, max_age=2, history=32),
        ids=True,
    ),
    "local_jiang_rebalance": Scenario(
        "local", True, lambda: sbfunc.policies.jiang_cdf(2.0, history=32), ids=True
    ),
}


def local_policy(policy: Policy, world: int) -> Policy:
    """One process's stand-in for a local selection: the ranks' parts replayed in rank order,
    each with ``fold_in(key, rank)``."""

    def select(scores, state, *, key, ids=None, epoch=0, elapsed=0.0, scored=None, signals=None):
        n, parts = scores.shape[0] // world, []
        for r in range(world):
            part = slice(r * n, (r + 1) * n)
            sel, state = policy.select(
                scores[part],
                state,
                key=sbrandom.fold_in(key, r),
                ids=None if ids is None else ids[part],
                epoch=epoch,
                elapsed=elapsed,
                scored=None if scored is None else scored[part],
                signals=None if signals is None else Signals(*(_rows(f, part) for f in signals)),
            )
            parts.append(sel)
        return _concat(parts, n), state

    return Policy(policy.init, select, needs=policy.needs)


def _rows(field: torch.Tensor | None, part: slice) -> torch.Tensor | None:
    return None if field is None else field[part]


def _concat(parts: list[Selection], n: int) -> Selection:
    indices = torch.cat([p.indices + r * n for r, p in enumerate(parts)])
    weights = None if parts[0].weights is None else torch.cat([p.weights for p in parts])
    return Selection(indices, weights)


def build(scenario: Scenario, comm: sbdist.Comm | None, *, algorithms: bool = True):
    """The step and state: data-parallel with the policy wrapped for the scenario's selection
    when ``comm`` is given, else the one-process reference (with the local selection
    emulated)."""
    net = model()
    loss_fn = sbfunc.per_sample_loss(net, F.cross_entropy, mode="train")
    policy = scenario.policy()
    if comm is None:
        policy = policy._replace(score_rows=None)  # a wrapped policy scores every row
        if scenario.kind == "local":
            policy = local_policy(policy, WORLD)
    else:
        wrap = sbdist.local_selection if scenario.kind == "local" else sbdist.global_selection
        policy = wrap(policy, rebalance=scenario.rebalance, comm=comm)
    # No loss reuse: a wrapped policy cannot record per-rank training losses, and the
    # one-process reference must decide from the same information.
    sb = sbfunc.SelectiveBackprop(
        0.0,
        1.0,
        interrupt=0,
        policy=policy,
        ids=2 if scenario.ids else None,
        scoring=sbfunc.score.Scoring(reuse_losses=False),
    )
    params, buffers = sbfunc.split_module(net, clone=True)
    algs = [sb] if algorithms else []
    split = scenario.microbatch_size
    if comm is None:
        step = sbfunc.make_train_step(
            loss_fn, sbfunc.optim.adam(1e-2), algs, microbatching=chunked(size=split)
        )
    else:
        step = sbdist.make_data_parallel_step(
            loss_fn,
            sbfunc.optim.adam(1e-2),
            algs,
            comm=comm,
            bucket_mb=1e-4,
            microbatching=chunked(size=split),
        )
    return step, step.init(params, buffers, key=KEY)


class Record(NamedTuple):
    params: dict[str, torch.Tensor]
    loss: torch.Tensor
    rows: int
    policy_state: Any


def run(step, state, *, rank: int, world: int, epochs: int = EPOCHS) -> list[Record]:
    """Train ``epochs`` epochs on this rank's shards, one record per step."""
    x, y = data()
    comm_like = _Ranked(rank, world)
    records = []
    for epoch in range(epochs):
        for batch in sbdist.sharded_batches(
            [x, y], BATCH * (WORLD // world), key=KEY, epoch=epoch, comm=comm_like
        ):
            state, metrics = step(state, batch)
            records.append(
                Record(
                    {k: v.clone() for k, v in state.params.items()},
                    metrics.loss.clone(),
                    metrics.samples_backpropagated,
                    _clone(state.algorithm_state[:1]),
                )
            )
        t = state.time
        state = state.replace(time=t._replace(epoch=t.epoch + 1, batch_in_epoch=0))
    return records


class _Ranked(sbdist.Comm):
    """A Comm that only says which rank's shard to read (the reference reads world 1)."""

    def __init__(self, rank: int, world: int) -> None:
        self.meter, self.group, self.rank, self.world = None, None, rank, world


def _clone(tree: Any) -> Any:
    return optree.tree_map(
        lambda v: v.clone() if isinstance(v, torch.Tensor) else v, tree, none_is_leaf=True
    )


def token_model() -> tuple[sbfunc.module.ModuleLoss, Any, Any]:
    """A tiny causal LM, its per-sample loss over real tokens and its tensors."""
    net = sbfunc.models.CausalLM(d_model=16, num_heads=2, num_layers=1, max_len=8, key=KEY)
    loss_fn = sbfunc.per_sample_loss(
        net,
        sbfunc.module.next_token_cross_entropy,
        input=("input_ids", "attention_mask"),
        target="labels",
    )
    return loss_fn, *sbfunc.split_module(net, clone=True)


def token_batch(rank: int) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s batch of 4 rows of 8 bytes, every token real (so that each rank keeps
    the same number of tokens and weighs the same in the mean of the ranks' gradients)."""
    ids = sbrandom.randint(sbrandom.fold_in(KEY, 100 + rank), (4, 8), 0, 257)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def token_selection() -> sbfunc.selective_backprop.TokenSelection:
    """Half of each rank's tokens by their own loss (distinct: no key decides)."""
    return sbfunc.selective_backprop.TokenSelection(0.5, score="loss")
