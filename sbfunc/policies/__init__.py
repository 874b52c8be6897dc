"""Selection policies: pure ``(init, select)`` pairs over explicit state, the one selection
type of sbfunc. The stateless fixed-count rules (:func:`rank_power`, :func:`top_k`,
:func:`random_subset`, whose state is :class:`~sbfunc.types.EmptyState`), the stateful ones,
and each rule's maths beside it (:func:`rank_power_indices`, :func:`divbs_indices`; the
last-layer gradient embedding :func:`last_layer_errors` and :func:`gradient_gram` that DivBS
and Bayesian selection share).

A *policy* is an optax-style pair of pure functions (``init``, ``select``) over an explicit
state. ``select(scores, state, *, key, ids=None, epoch=0, elapsed=0.0)`` returns a
:class:`~sbfunc.select.Selection` of the rows to backpropagate and the next state; the input
state is never modified.

**Scores** are a 1-D tensor of real numbers; integer and bool scores (an integer loss, a 0/1
error) are cast to the default float dtype, in one place (:func:`as_scores`), so every
policy selects from them the same rows as from the same values as floats. A non-tensor raises
``TypeError``, another shape ``ValueError``.

**Weights.** When a policy returns ``Selection.weights``, they are normalised for the estimator
the training step uses, the *mean over the kept rows* ``(1/k) * sum_{j in S} w_j * L_j``: its
expectation over the policy's randomness equals the full-batch mean ``(1/N) * sum_i L_i`` for
any per-sample losses ``L``. With inclusion probabilities ``pi_i`` and ``k`` kept rows this is
the Horvitz-Thompson estimator with ``w_j = k / (N * pi_j)`` (:func:`horvitz_thompson`).
Policies that return ``weights=None`` (rank-power, top-k, Jiang, Loshchilov, RHO-LOSS) are
biased on purpose: they focus the step on the selected rows.

**Non-finite scores** rank below every finite score in every policy (see
:mod:`sbfunc.select`): a row whose score is NaN or infinite is never kept while finite
rows can fill the selection, and it is never recorded in a policy's state.
"""

from sbfunc._namespace import api_dir, moved_names
from sbfunc.policies._base import (
    Policy,
    PolicyState,
    Record,
    ScoreRows,
    SelectArgs,
    SelectPolicy,
    as_scores,
    bernoulli_selection,
    check_ids,
    check_scores,
    horvitz_thompson,
    make_policy,
    select_args,
    stateless,
)
from sbfunc.policies._bayesian import BayesianState, bayesian
from sbfunc.policies._divbs import divbs, divbs_indices
from sbfunc.policies._importance import (
    ImportanceState,
    grad_norm_importance,
    logit_grad_norm,
    tau_threshold,
    variance_reduction,
)
from sbfunc.policies._infobatch import infobatch
from sbfunc.policies._jiang import StaleState, jiang_cdf, stale_sb
from sbfunc.policies._last_layer import gradient_gram, last_layer_errors
from sbfunc.policies._loshchilov import loshchilov
from sbfunc.policies._rank_power import rank_power, rank_power_indices, rank_power_log_weights
from sbfunc.policies._rho_loss import RhoState, rho_loss
from sbfunc.policies._tables import LossHistory, LossTable
from sbfunc.policies._top_k import random_subset, top_k

__all__ = [
    "BayesianState",
    "ImportanceState",
    "LossHistory",
    "LossTable",
    "Policy",
    "PolicyState",
    "Record",
    "RhoState",
    "ScoreRows",
    "SelectArgs",
    "SelectPolicy",
    "StaleState",
    "as_scores",
    "bayesian",
    "bernoulli_selection",
    "check_ids",
    "check_scores",
    "divbs",
    "divbs_indices",
    "grad_norm_importance",
    "gradient_gram",
    "horvitz_thompson",
    "infobatch",
    "jiang_cdf",
    "last_layer_errors",
    "logit_grad_norm",
    "loshchilov",
    "make_policy",
    "random_subset",
    "rank_power",
    "rank_power_indices",
    "rank_power_log_weights",
    "rho_loss",
    "select_args",
    "stale_sb",
    "stateless",
    "tau_threshold",
    "top_k",
    "variance_reduction",
]

__getattr__ = moved_names(
    "sbfunc.policies",
    (
        "1.1",
        (
            "sbfunc.selective_backprop",
            ("Pruned", "Queue", "apply_policy", "dequeue", "empty_queue", "enqueue", "flush"),
        ),
    ),
    ("1.2", ("sbfunc.types", ("EmptyState",))),
)
__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
