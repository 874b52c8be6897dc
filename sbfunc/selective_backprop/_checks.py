"""Selective Backprop's argument checks (numbers: :mod:`sbfunc.validation`)."""

from __future__ import annotations

from sbfunc.policies import Policy, rank_power
from sbfunc.select import check_keep

__all__ = ["check_policy"]


def check_policy(keep: float | None, policy: Policy | None) -> tuple[float | None, Policy]:
    """``(keep, policy)``: ``keep`` (default 0.5) with the rank-power policy, or ``None`` with
    the given ``policy``."""
    if policy is None:
        checked = check_keep(0.5 if keep is None else keep)
        return checked, rank_power(checked)
    if not isinstance(policy, Policy):
        raise TypeError(
            f"policy must be an sbfunc.policies.Policy (e.g. sbfunc.policies.top_k(0.3)), "
            f"got {policy!r:.80}"
        )
    if keep is not None:
        raise ValueError(
            f"keep={keep!r} and policy= both choose the kept rows: keep sets the fraction of "
            "the default rank-power policy; give the fraction to the policy instead (e.g. "
            "policy=sbfunc.policies.rank_power(0.3)) and leave keep out"
        )
    return None, policy
