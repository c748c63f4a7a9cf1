"""The interface every consistency policy implements.

A policy is a pure object: it keeps clocks and counters, never does I/O, and
answers the parameter server's questions with typed decisions. The server
carries the decisions out (apply a push, drop it, or make the caller wait).
Policies are unit-tested with a fake clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["PushAction", "PushDecision", "PullDecision", "ConsistencyPolicy"]


class PushAction(enum.Enum):
    """What the server does with a pushed update."""

    APPLY = "apply"
    DROP = "drop"
    WAIT = "wait"


@dataclass(frozen=True)
class PushDecision:
    action: PushAction
    reason: str = ""


@dataclass(frozen=True)
class PullDecision:
    """Whether a pull may be answered now (``wait=False``) or must wait."""

    wait: bool = False
    reason: str = ""


class ConsistencyPolicy:
    """Base class: decides, per push and per pull, apply / drop / wait.

    Subclasses override the hooks they need. ``now`` is a float time in
    seconds supplied by the caller (a fake clock in tests).
    """

    #: Name used in configs and logs.
    name = "base"

    def on_push(self, worker: int, clock: int, now: float) -> PushDecision:
        """Called before a push from ``worker`` made at ``clock`` is applied."""
        return PushDecision(PushAction.APPLY)

    def on_pull(self, worker: int, clock: int, now: float) -> PullDecision:
        """Called before a pull by ``worker`` about to start ``clock``."""
        return PullDecision(False)

    def on_applied(self, worker: int, clock: int, now: float) -> None:
        """Called after a push was applied (advance clocks here)."""

    def describe(self) -> dict:
        """Current state for status RPCs and logs (JSON-able)."""
        return {"policy": self.name}
