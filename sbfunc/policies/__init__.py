"""Selection policies: pure ``(init, select)`` pairs over explicit state (see
:mod:`sbfunc.policies.base` for the conventions, the weights included), and the refill queue.
"""

from sbfunc.policies.apply import Pruned, apply_policy, score_needed
from sbfunc.policies.base import (
    EmptyState,
    Policy,
    PolicyState,
    Record,
    ScoreRows,
    SelectArgs,
    SelectPolicy,
    bernoulli_selection,
    check_fraction,
    check_ids,
    check_positive_int,
    check_scores,
    horvitz_thompson,
    make_policy,
    stateless,
)
from sbfunc.policies.fixed_count import random_policy, rank_power_policy, rho_loss, top_k_policy
from sbfunc.policies.importance import (
    ImportanceState,
    grad_norm_importance,
    logit_grad_norm,
    tau_threshold,
    variance_reduction,
)
from sbfunc.policies.infobatch import infobatch
from sbfunc.policies.jiang import StaleState, jiang_cdf, needs_scoring, stale_sb
from sbfunc.policies.loshchilov import loshchilov
from sbfunc.policies.queue import Queue, dequeue, empty_queue, enqueue, flush
from sbfunc.policies.tables import (
    LossHistory,
    LossTable,
    history_cdf,
    history_init,
    history_push,
    table_init,
    table_lookup,
    table_needs,
    table_ranks,
    table_record,
    table_update,
)

__all__ = [
    "EmptyState",
    "ImportanceState",
    "LossHistory",
    "LossTable",
    "Policy",
    "PolicyState",
    "Pruned",
    "Queue",
    "Record",
    "ScoreRows",
    "SelectArgs",
    "SelectPolicy",
    "StaleState",
    "apply_policy",
    "bernoulli_selection",
    "check_fraction",
    "check_ids",
    "check_positive_int",
    "check_scores",
    "dequeue",
    "empty_queue",
    "enqueue",
    "flush",
    "grad_norm_importance",
    "history_cdf",
    "history_init",
    "history_push",
    "horvitz_thompson",
    "infobatch",
    "jiang_cdf",
    "logit_grad_norm",
    "loshchilov",
    "make_policy",
    "needs_scoring",
    "random_policy",
    "rank_power_policy",
    "rho_loss",
    "score_needed",
    "stale_sb",
    "stateless",
    "table_init",
    "table_lookup",
    "table_needs",
    "table_ranks",
    "table_record",
    "table_update",
    "tau_threshold",
    "top_k_policy",
    "variance_reduction",
]
