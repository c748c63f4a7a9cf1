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
from tfdist.consistency.modes import MODES, ConsistencyMode, mode_of, register_mode
from tfdist.consistency.sync_replicas import BSPPolicy, SyncReplicasPolicy
from tfdist.errors import ConfigError

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
    "ConsistencyMode",
    "MODES",
    "mode_of",
    "register_mode",
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

def _ssp(p, n):
    s = p["staleness"]
    return SSPPolicy(math.inf if s is None else int(s), bool(p.get("refresh_every_step", False)))


def _sync_replicas(p, n):
    if p["replicas_to_aggregate"] is None:  # a spec names M (the config fills in every worker)
        raise ValueError("replicas_to_aggregate is required")
    m = int(p["replicas_to_aggregate"])
    # M of N keeps its ratio as workers come and go; without a known N, M stays fixed.
    return SyncReplicasPolicy(m, num_workers=int(n) if n and n >= m else None)


#: The built-in modes (DESIGN.md §4): one descriptor each; see :mod:`tfdist.consistency.modes`.
for _mode in (
    ConsistencyMode("async", "update", {}, lambda p, n: AsyncPolicy(),
                    "ASP: push every step, never wait; fresh values every step", local_steps=True),
    ConsistencyMode("ssp", "update", {"staleness": 3}, _ssp, "SSP: a worker never runs more than s clocks ahead"),
    ConsistencyMode("dtssp", "update", {"min_staleness": 3, "max_staleness": 10, "window": 10, "delta": 0.01},
                    lambda p, n: DTSSPPolicy(int(p["min_staleness"]), int(p["max_staleness"]),
                                             window=int(p["window"]), delta=float(p["delta"])),
                    "DTSSP: SSP whose bound moves with learning progress"),
    ConsistencyMode("bsp", "gradient", {"replicas_to_aggregate": None},
                    lambda p, n: BSPPolicy(int(p["replicas_to_aggregate"] or n)),
                    "BSP: every live worker's gradient, every step"),
    ConsistencyMode("sync_replicas", "gradient", {"replicas_to_aggregate": None}, _sync_replicas,
                    "SyncReplicas: the first M of N gradients of every step", needs_all_aggregated=True),
):
    register_mode(_mode)

#: The built-in modes' names (every registered one: :func:`tfdist.consistency.modes.mode_names`).
POLICY_NAMES = tuple(MODES)

#: The parameters each built-in mode takes (the ``strategy:`` config fields that travel in its spec).
POLICY_PARAMS = {name: tuple(mode.params) for name, mode in MODES.items()}


def policy_from_spec(spec: Mapping[str, Any], num_workers: int = 1) -> ConsistencyPolicy:
    """Builds a policy from its :meth:`~ConsistencyPolicy.spec` mapping (through the mode's descriptor)."""
    if not isinstance(spec, Mapping):
        raise ConfigError(f"A consistency spec is a mapping with `policy`. Received: {spec!r}.")
    return mode_of(spec.get("policy")).policy(spec, num_workers)


def make_policy(name: str, num_workers: int = 1, **params) -> ConsistencyPolicy:
    """Returns a fresh policy for a consistency-mode name and its parameters.

    With :func:`policy_from_spec` and :meth:`ConsistencyPolicy.spec` this is
    the one codec of consistency settings: the config, the strategies and
    the parameter servers all go through it.
    """
    return policy_from_spec({"policy": name, **params}, num_workers)
