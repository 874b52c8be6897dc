"""The methods of the time-to-accuracy study and of the selection field, one shared table.

Every method is a list of algorithms (before the study's audit) made by a factory in
:func:`methods`; per-run tables (RHO-LOSS's irreducible losses, the Bayesian policy's
reference log-likelihoods) live in the policy's state and are swapped in per run by
:func:`with_run_tables`, so one compiled step serves every seed and noise level."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

import sbfunc
from sbfunc import policies as P

# time_to_accuracy.py's methods (its default set; the table holds the field's methods too)
TTA_METHODS = (
    "plain", "rank_power", "rank_power_s0.5", "top_k", "random", "jiang_var", "stale_sb",
    "loshchilov", "loshchilov_noage", "infobatch", "grad_norm", "rho_loss",
)  # fmt: skip
# InfoBatch keeps 1 - r * f of a batch, f the share of rows below the mean recorded loss:
# the field assumes f = 0.7 to aim at a budget, and r < 1 caps how low it goes
INFOBATCH_LEARNED, INFOBATCH_MAX_RATIO = 0.7, 0.99


class Sizes(Protocol):
    """What the studies' helpers read from a config (``time_to_accuracy.Config``): the table,
    the protocols (``_tta_protocol``) and the training loop (``_tta_train``)."""

    @property
    def train(self) -> int: ...
    @property
    def width(self) -> int: ...
    @property
    def keep(self) -> float: ...
    @property
    def start(self) -> float: ...
    @property
    def batch(self) -> int: ...
    @property
    def epochs(self) -> int: ...
    @property
    def lr(self) -> float: ...
    @property
    def evals_per_epoch(self) -> int: ...


def head_features(width: int) -> int:
    """The input size of the CNN's head (``width`` channels at 10 pooled positions)."""
    return width * 10


def infobatch_ratio(keep: float) -> float:
    """InfoBatch's prune ratio ``r`` whose expected kept share ``1 - r * f`` is ``keep`` at
    ``f = INFOBATCH_LEARNED``, capped at ``INFOBATCH_MAX_RATIO``."""
    return min(INFOBATCH_MAX_RATIO, max(0.0, (1.0 - keep) / INFOBATCH_LEARNED))


def sb(cfg: Sizes, policy: P.Policy, **kw: Any) -> sbfunc.SelectiveBackprop:
    """Selective Backprop in the study's window ``[cfg.start, 1)`` on ``(x, y, ids)`` batches."""
    return sbfunc.SelectiveBackprop(cfg.start, 1.0, interrupt=0, policy=policy, ids=2, **kw)


def methods(
    cfg: Sizes,
    loss_fn: sbfunc.module.ModuleLoss,
    grad_norm_fn: sbfunc.module.ModuleLoss,
    keep: float | None = None,
) -> dict[str, Callable[[], list[Any]]]:
    """Each method's algorithms (before the audit) at the kept fraction ``keep`` (default
    ``cfg.keep``). RHO-LOSS's and the Bayesian policy's tables are placeholders here: each run
    puts its own in the state (:func:`with_run_tables`)."""
    k, n = cfg.keep if keep is None else keep, cfg.train
    grad_scoring = sbfunc.score.Scoring(loss_fn=grad_norm_fn)
    table: dict[str, Callable[[], list[Any]]] = {
        "plain": lambda: [],
        "rank_power": lambda: [sb(cfg, P.rank_power(k))],
        "rank_power_s0.5": lambda: [sb(cfg, P.rank_power(k), scale_factor=0.5)],
        "top_k": lambda: [sb(cfg, P.top_k(k))],
        "random": lambda: [sb(cfg, P.random_subset(k))],
        "jiang_var": lambda: [sb(cfg, P.jiang_cdf(1.0))],
        "stale_sb": lambda: [sb(cfg, P.stale_sb(1.0, num_ids=n, max_age=2))],
        "loshchilov": lambda: [sb(cfg, P.loshchilov(100.0, k, num_ids=n, max_age=2))],
        "loshchilov_k0.3": lambda: [sb(cfg, P.loshchilov(100.0, 0.3, num_ids=n, max_age=2))],
        # never rescored: after its first epoch the step forwards only the kept rows
        "loshchilov_noage": lambda: [sb(cfg, P.loshchilov(100.0, k, num_ids=n))],
        "infobatch": lambda: [sb(cfg, P.infobatch(0.5, 0.875, num_ids=n))],
        "infobatch_budget": lambda: [sb(cfg, P.infobatch(infobatch_ratio(k), 1.0, num_ids=n))],
        "grad_norm": lambda: [sb(cfg, P.grad_norm_importance(k), scoring=grad_scoring)],
        "rho_loss": lambda: [sb(cfg, P.rho_loss(k, torch.zeros(n)))],
    }
    f = head_features(cfg.width)
    table["divbs"] = lambda: [sb(cfg, P.divbs(k))]
    table["bayesian"] = lambda: [
        sb(cfg, P.bayesian(k, num_features=f, num_classes=10, reference_losses=torch.zeros(n)))
    ]
    return table


def with_run_tables(method: str, state: Any, irreducible: torch.Tensor) -> Any:
    """The policy state ``state`` of ``method`` with this run's per-id tables: RHO-LOSS's
    irreducible losses, the Bayesian policy's reference losses (the same table)."""
    if method == "rho_loss":
        return P.RhoState(irreducible)
    if method == "bayesian":
        if "reference_losses" not in getattr(state, "_fields", ()):
            raise ValueError(
                f"bayesian's state {type(state).__name__} has no 'reference_losses' field: a "
                "compiled step cannot take each run's reference losses"
            )
        return state._replace(reference_losses=irreducible.to(state.reference_losses))
    return state


class Audit(sbfunc.Algorithm):
    """Counts, on ``AFTER_LOSS``, the backpropagated rows whose label was flipped (by id).

    Its state is ``(count, mislabelled mask)``: the mask of the run is set in the state, so
    one compiled step serves every seed and noise level."""

    uses_key = False

    def __init__(self, num_ids: int) -> None:
        self.num_ids = num_ids

    def init(self, key: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros((), dtype=torch.int64), torch.zeros(self.num_ids, dtype=torch.int64)

    def match(self, event: sbfunc.Event, state: sbfunc.Context) -> bool:
        return event == sbfunc.Event.AFTER_LOSS

    def apply(self, event: sbfunc.Event, state: sbfunc.Context) -> sbfunc.Context:
        count, mask = state.own
        return state.replace(own=(count + mask.index_select(0, state.batch[2]).sum(), mask))
