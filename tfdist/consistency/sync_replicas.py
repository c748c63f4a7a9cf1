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

Elastic membership (the rule tfdist states, since TF1 fixed ``N``): the
barrier is sized at every step boundary from the ``N_t`` workers awaited at
that moment. BSP waits for all of them (``M_t = N_t``); SyncReplicas keeps
the job's aggregation *ratio*, ``M_t = max(1, ceil(M * N_t / N))`` with ``M``
and ``N`` the configured values (3 of 4 becomes 6 of 8 after four workers
join, 2 of 2 after two leave). Within a step, a worker that dies lowers the
requirement to the gradients still possible; one that joins mid-step is
counted from the next step on. Whatever the count, the PS scales the sum to
the mean of the gradients it aggregated.
"""

from __future__ import annotations

import math

from tfdist.consistency.base import ConsistencyPolicy, GradientAction, GradientDecision, PolicyContext

__all__ = ["SyncReplicasPolicy", "BSPPolicy"]


class SyncReplicasPolicy(ConsistencyPolicy):
    """Aggregate the first ``replicas_to_aggregate`` gradients of every step.

    Args:
        replicas_to_aggregate: ``M``, gradients per global step. When fewer
            workers are live, the step completes with all live workers.
    """

    name = "sync_replicas"

    def __init__(self, replicas_to_aggregate: int, num_workers: int | None = None):
        if not isinstance(replicas_to_aggregate, int) or replicas_to_aggregate < 1:
            raise ValueError(
                f"replicas_to_aggregate must be an integer >= 1. Received: replicas_to_aggregate={replicas_to_aggregate!r}."
            )
        if num_workers is not None and (not isinstance(num_workers, int) or num_workers < 1):
            raise ValueError(f"num_workers must be an integer >= 1. Received: num_workers={num_workers!r}.")
        self.replicas_to_aggregate = replicas_to_aggregate
        #: ``N`` the ratio refers to; ``None`` keeps ``M`` fixed.
        self.num_workers = num_workers
        #: ``M_t``: the barrier of the current step (set at step boundaries).
        self.step_replicas = replicas_to_aggregate

    def replicas_for(self, num_awaited: int) -> int:
        """``M_t`` for a step that starts with ``num_awaited`` workers."""
        if not self.num_workers or num_awaited <= 0:
            return self.replicas_to_aggregate
        return max(1, math.ceil(self.replicas_to_aggregate * num_awaited / self.num_workers))

    def on_step_boundary(self, ctx: PolicyContext) -> None:
        self.step_replicas = self.replicas_for(len(ctx.awaited))

    def required(self, contributors: frozenset[int], ctx: PolicyContext) -> int:
        """Gradients needed to complete the current step.

        Dead, finished and detected-straggler workers are not waited for.
        """
        available = len(ctx.awaited | contributors)
        return max(1, min(self.step_replicas, available))

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

    def aggregation_size(self) -> int:
        return self.replicas_to_aggregate

    def spec(self) -> dict:
        return {"policy": self.name, "replicas_to_aggregate": self.replicas_to_aggregate}

    def describe(self) -> dict:
        return {**self.spec(), "step_replicas": self.step_replicas}


class BSPPolicy(SyncReplicasPolicy):
    """BSP: every live worker's gradient, every step (SyncReplicas with M = N)."""

    name = "bsp"

    def __init__(self, num_workers: int):
        super().__init__(num_workers, num_workers)

    def replicas_for(self, num_awaited: int) -> int:
        return max(1, num_awaited) if num_awaited > 0 else self.replicas_to_aggregate

    def spec(self) -> dict:
        return {"policy": self.name, "replicas_to_aggregate": self.replicas_to_aggregate}
