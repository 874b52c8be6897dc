"""Selection policies: pure ``(init, select)`` pairs over explicit state, the one selection
type of sbfunc (see :mod:`sbfunc.policies.base` for the conventions, the weights and the
non-finite rule included): the stateless fixed-count rules (:func:`rank_power`, :func:`top_k`,
:func:`random_subset`, with :class:`EmptyState`), the stateful ones, and the refill queue.
"""

from sbfunc._namespace import api_dir
from sbfunc.policies.apply import Pruned, apply_policy
from sbfunc.policies.base import (
    EmptyState,
    Policy,
    PolicyState,
    Record,
    ScoreRows,
    SelectArgs,
    SelectPolicy,
    bernoulli_selection,
    horvitz_thompson,
    make_policy,
    stateless,
)
from sbfunc.policies.bayesian import BayesianState, bayesian
from sbfunc.policies.diverse import divbs
from sbfunc.policies.fixed_count import RhoState, random_subset, rank_power, rho_loss, top_k
from sbfunc.policies.importance import (
    ImportanceState,
    grad_norm_importance,
    logit_grad_norm,
    tau_threshold,
    variance_reduction,
)
from sbfunc.policies.infobatch import infobatch
from sbfunc.policies.jiang import StaleState, jiang_cdf, stale_sb
from sbfunc.policies.loshchilov import loshchilov
from sbfunc.policies.queue import Queue, dequeue, empty_queue, enqueue, flush
from sbfunc.policies.tables import LossHistory, LossTable

__all__ = [
    "BayesianState",
    "EmptyState",
    "ImportanceState",
    "LossHistory",
    "LossTable",
    "Policy",
    "PolicyState",
    "Pruned",
    "Queue",
    "Record",
    "RhoState",
    "ScoreRows",
    "SelectArgs",
    "SelectPolicy",
    "StaleState",
    "apply_policy",
    "bayesian",
    "bernoulli_selection",
    "dequeue",
    "divbs",
    "empty_queue",
    "enqueue",
    "flush",
    "grad_norm_importance",
    "horvitz_thompson",
    "infobatch",
    "jiang_cdf",
    "logit_grad_norm",
    "loshchilov",
    "make_policy",
    "random_subset",
    "rank_power",
    "rho_loss",
    "stale_sb",
    "stateless",
    "tau_threshold",
    "top_k",
    "variance_reduction",
]


__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
