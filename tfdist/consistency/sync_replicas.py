"""SyncReplicas (first M of N) and BSP (all live workers) on the gradient path.

TF1 ``SyncReplicasOptimizer`` semantics: global step ``t`` aggregates the
first ``M`` gradients computed *for step t* (the server sums them; Keras has
already divided every worker's loss by ``num_replicas_in_sync = M``, so the
sum is the mean); the step is then complete, the global step advances once,
and a gradient that arrives later for step ``t`` is stale and dropped. Every
worker, dropped or not, continues from the same aggregate. ``N - M`` backup
workers absorb stragglers. With ``M`` >= the number of live workers the step
waits for every live worker: BSP. Dead or finished workers, and workers a
straggler detector flagged (until they recover), are not waited for; when a
step completes with fewer than ``M`` gradients the server scales their sum to
their mean, so the update's size does not depend on how many arrived.
"""

from __future__ import annotations

from tfdist.consistency.base import ConsistencyPolicy, GradientAction, GradientDecision, PolicyContext

__all__ = ["SyncReplicasPolicy", "BSPPolicy"]


class SyncReplicasPolicy(ConsistencyPolicy):
    """Aggregate the first ``replicas_to_aggregate`` gradients of every step.

    Args:
        replicas_to_aggregate: ``M``, gradients per global step. When fewer
            workers are live, the step completes with all live workers.
    """

    name = "sync_replicas"
    path = "gradient"

    def __init__(self, replicas_to_aggregate: int):
        if not isinstance(replicas_to_aggregate, int) or replicas_to_aggregate < 1:
            raise ValueError(
                f"replicas_to_aggregate must be an integer >= 1. Received: replicas_to_aggregate={replicas_to_aggregate!r}."
            )
        self.replicas_to_aggregate = replicas_to_aggregate

    def required(self, contributors: frozenset[int], ctx: PolicyContext) -> int:
        """Gradients needed to complete the current step.

        Dead, finished and detected-straggler workers are not waited for.
        """
        available = len(ctx.awaited | contributors)
        return max(1, min(self.replicas_to_aggregate, available))

    def on_gradient(self, worker, step, global_step, contributors, ctx) -> GradientDecision:
        if step < global_step:
            return GradientDecision(GradientAction.STALE, f"step {step} already complete (global step {global_step})")
        if step > global_step:
            return GradientDecision(GradientAction.FUTURE, f"step {step} is ahead of the global step {global_step}")
        if worker in contributors:
            return GradientDecision(GradientAction.DUPLICATE, f"worker {worker} already sent a gradient for step {step}")
        return GradientDecision(GradientAction.ACCUMULATE)

    def step_complete(self, contributors: frozenset[int], ctx: PolicyContext) -> bool:
        return len(contributors) >= self.required(contributors, ctx)

    def spec(self) -> dict:
        return {"policy": self.name, "replicas_to_aggregate": self.replicas_to_aggregate}


class BSPPolicy(SyncReplicasPolicy):
    """BSP: every live worker's gradient, every step (SyncReplicas with M = N)."""

    name = "bsp"

    def __init__(self, num_workers: int):
        super().__init__(num_workers)

    def spec(self) -> dict:
        return {"policy": self.name, "replicas_to_aggregate": self.replicas_to_aggregate}
