"""Consistency policies the parameter server consults on every push and pull.

One family (DESIGN.md §4): ASP = SSP(∞) refreshing every step, SSP(s),
DTSSP(s_min..s_max), and on the gradient path SyncReplicas(M of N) with BSP
as SyncReplicas(all live workers).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from tfdist.consistency.base import (
    ConsistencyPolicy,
    GradientAction,
    GradientDecision,
    PolicyContext,
    PullDecision,
    PushAction,
    PushDecision,
)
from tfdist.consistency.dtssp import DTSSPPolicy, StalenessChange, learning_progress_ratio, next_staleness
from tfdist.consistency.ssp import AsyncPolicy, SSPPolicy, cache_is_fresh_enough
from tfdist.consistency.sync_replicas import BSPPolicy, SyncReplicasPolicy

__all__ = [
    "ASP",
    "BSP",
    "DTSSP",
    "SSP",
    "SyncReplicas",
    "AsyncPolicy",
    "BSPPolicy",
    "ConsistencyPolicy",
    "DTSSPPolicy",
    "GradientAction",
    "GradientDecision",
    "PolicyContext",
    "PullDecision",
    "PushAction",
    "PushDecision",
    "SSPPolicy",
    "StalenessChange",
    "SyncReplicasPolicy",
    "cache_is_fresh_enough",
    "learning_progress_ratio",
    "make_policy",
    "POLICY_NAMES",
    "POLICY_PARAMS",
    "next_staleness",
    "policy_from_spec",
]

#: Short aliases: ``tfdist.consistency.SSP(3)``.
SSP = SSPPolicy
DTSSP = DTSSPPolicy
SyncReplicas = SyncReplicasPolicy
BSP = BSPPolicy
ASP = AsyncPolicy

POLICY_NAMES = ("async", "bsp", "sync_replicas", "ssp", "dtssp")

#: The parameters each mode takes (the ``strategy:`` config fields that travel in its spec).
POLICY_PARAMS = {
    "async": (),
    "ssp": ("staleness",),
    "dtssp": ("min_staleness", "max_staleness", "window", "delta"),
    "bsp": ("replicas_to_aggregate",),
    "sync_replicas": ("replicas_to_aggregate",),
}


def policy_from_spec(spec: Mapping[str, Any], num_workers: int = 1) -> ConsistencyPolicy:
    """Builds a policy from its :meth:`~ConsistencyPolicy.spec` mapping."""
    from tfdist.errors import ConfigError

    name = spec.get("policy")
    try:
        if name == "async":
            return AsyncPolicy()
        if name == "ssp":
            s = spec.get("staleness")
            return SSPPolicy(math.inf if s is None else int(s), bool(spec.get("refresh_every_step", False)))
        if name == "dtssp":
            return DTSSPPolicy(int(spec.get("min_staleness", 3)), int(spec.get("max_staleness", 10)),
                               window=int(spec.get("window", 10)), delta=float(spec.get("delta", 0.01)))
        if name == "bsp":
            return BSPPolicy(int(spec.get("replicas_to_aggregate") or num_workers))
        if name == "sync_replicas":
            m = int(spec["replicas_to_aggregate"])
            # M of N keeps its ratio as workers come and go; without a known N, M stays fixed.
            return SyncReplicasPolicy(m, num_workers=int(num_workers) if num_workers and num_workers >= m else None)
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"Bad consistency settings {dict(spec)!r}: {e}") from e
    raise ConfigError(f"Unknown consistency mode. Received: consistency={name!r}. Use one of {list(POLICY_NAMES)}.")


def make_policy(name: str, num_workers: int = 1, **params) -> ConsistencyPolicy:
    """Returns a fresh policy for a consistency-mode name and its parameters.

    With :func:`policy_from_spec` and :meth:`ConsistencyPolicy.spec` this is
    the one codec of consistency settings: the config, the strategies and
    the parameter servers all go through it.
    """
    return policy_from_spec({"policy": name, **params}, num_workers)
