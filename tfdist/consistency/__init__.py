"""Consistency policies the parameter server consults on every push and pull."""

from tfdist.consistency.asp import AsyncPolicy
from tfdist.consistency.base import ConsistencyPolicy, PullDecision, PushAction, PushDecision

__all__ = ["AsyncPolicy", "ConsistencyPolicy", "PullDecision", "PushAction", "PushDecision", "make_policy"]


def make_policy(name: str) -> ConsistencyPolicy:
    """Returns a fresh policy object for a consistency-mode name."""
    from tfdist.errors import ConfigError

    policies = {"async": AsyncPolicy}
    if name not in policies:
        raise ConfigError(f"Unknown consistency mode. Received: consistency={name!r}. Use one of {sorted(policies)}.")
    return policies[name]()
