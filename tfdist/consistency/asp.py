"""ASP: asynchronous parallel updates (SSP with an infinite bound).

Every push is applied when it arrives and no pull ever waits: the Hogwild /
TF1 between-graph asynchronous parameter-server regime.
"""

from __future__ import annotations

from tfdist.consistency.base import ConsistencyPolicy, PullDecision, PushAction, PushDecision

__all__ = ["AsyncPolicy"]


class AsyncPolicy(ConsistencyPolicy):
    """Apply every push at once; never make a pull wait."""

    name = "async"

    def __init__(self):
        self.clocks: dict[int, int] = {}

    def on_push(self, worker: int, clock: int, now: float) -> PushDecision:
        return PushDecision(PushAction.APPLY)

    def on_pull(self, worker: int, clock: int, now: float) -> PullDecision:
        return PullDecision(False)

    def on_applied(self, worker: int, clock: int, now: float) -> None:
        self.clocks[worker] = max(self.clocks.get(worker, -1), clock)

    def describe(self) -> dict:
        return {"policy": self.name, "clocks": {str(k): v for k, v in sorted(self.clocks.items())}}
