"""SSP: stale synchronous parallel (Ho et al., NIPS 2013); ASP is SSP(∞).

Let ``c_i`` be worker i's clock: its completed steps, which is also the
0-based index of the step it is about to start; an update made in step ``k``
is "from clock ``k``". Worker i may *start* clock ``c`` only if
``c - min_j c_j <= s`` over live workers. A read at clock ``c`` is then
guaranteed to include every update from clocks ``<= c - s - 1`` of all
workers, and all of the reader's own (read-my-writes: workers apply their own
updates locally at once). A worker refreshes its cache only when that
guarantee would otherwise break (:func:`cache_is_fresh_enough`), so SSP pulls
less often than ASP, which refreshes every step.

Elastic membership: a worker that joins a running job (or comes back after
it left) *adopts* the slowest clock of the live workers (``on_join``), so it
neither holds the others back at clock 0 nor skips ahead of the bound; the
PS tells it its clock in the reply to its first pull.
"""

from __future__ import annotations

import math

from tfdist.consistency.base import ConsistencyPolicy, PolicyContext, PullDecision, PushAction, PushDecision

__all__ = ["SSPPolicy", "AsyncPolicy", "cache_is_fresh_enough", "min_clock"]


def min_clock(clocks: dict[int, int], live: frozenset[int] | set[int]) -> int:
    """Smallest clock among live workers (workers never heard of count as 0)."""
    if not live:
        return min(clocks.values(), default=0)
    return min(clocks.get(w, 0) for w in live)


def cache_is_fresh_enough(clock: int, cache_min_clock: int, staleness: float) -> bool:
    """Whether a cache pulled when every worker had completed ``cache_min_clock``
    steps may serve a read at ``clock`` (it must hold all updates from clocks
    ``<= clock - staleness - 1``, i.e. every worker must have completed
    ``clock - staleness`` steps)."""  # noqa: D401
    return math.isinf(staleness) or cache_min_clock >= clock - staleness


class SSPPolicy(ConsistencyPolicy):
    """Bounded staleness ``s``: a worker at clock ``c`` waits while ``c - min clock > s``.

    Args:
        staleness: The bound ``s`` >= 0, or ``math.inf`` for ASP.
        refresh_every_step: Pull fresh values after every step even when the
            bound does not require it (ASP's behaviour). Defaults to ``False``.
    """

    name = "ssp"

    def __init__(self, staleness: float = 3, refresh_every_step: bool = False):
        if not (math.isinf(staleness) or (float(staleness).is_integer() and staleness >= 0)):
            raise ValueError(f"staleness must be an integer >= 0 or math.inf. Received: staleness={staleness!r}.")
        self.staleness = staleness
        self.refresh_every_step = refresh_every_step
        self.clocks: dict[int, int] = {}

    def min_clock(self, ctx: PolicyContext) -> int:
        """Slowest clock among awaited workers (detected stragglers do not hold others back)."""
        return min_clock(self.clocks, ctx.awaited or ctx.live)

    def on_push(self, worker: int, clock: int, ctx: PolicyContext) -> PushDecision:
        return PushDecision(PushAction.APPLY)

    def read_may_wait(self) -> bool:
        return not math.isinf(self.staleness)

    def clock_fields(self, ctx: PolicyContext) -> dict:
        return {"min_clock": self.min_clock(ctx),
                "staleness": None if math.isinf(self.staleness) else int(self.staleness)}

    def on_pull(self, worker: int, clock: int, ctx: PolicyContext) -> PullDecision:
        if math.isinf(self.staleness):
            return PullDecision(False)
        lag = clock - self.min_clock(ctx)
        if lag > self.staleness:
            return PullDecision(True, f"clock {clock} is {lag} ahead of the slowest live worker (bound {self.staleness:g})")
        return PullDecision(False)

    def on_applied(self, worker: int, clock: int, ctx: PolicyContext, loss: float | None = None) -> None:
        self.clocks[worker] = max(self.clocks.get(worker, 0), clock)

    def on_read(self, worker: int, clock: int):
        # A read at clock c follows the worker's push of its c-th step, so its clock is at least c already;
        # after a PS task restored a checkpoint (older clocks, pushes lost) this brings it back, so readers
        # that all wait for each other's lost pushes do not deadlock.
        if clock <= self.clocks.get(worker, 0):
            return None
        had, before = worker in self.clocks, self.clocks.get(worker)
        self.clocks[worker] = clock

        def undo() -> None:
            if self.clocks.get(worker) == clock:
                if had:
                    self.clocks[worker] = before
                else:
                    del self.clocks[worker]

        return undo

    def on_join(self, worker: int, ctx: PolicyContext) -> None:
        others = ctx.awaited - {worker} or ctx.live - {worker}
        if others:
            self.clocks[worker] = max(self.clocks.get(worker, 0), min_clock(self.clocks, others))

    def clock_of(self, worker: int) -> int | None:
        """The clock the PS holds for ``worker`` (adopted on join, then its own)."""
        return self.clocks.get(worker, 0)

    def spec(self) -> dict:
        s = None if math.isinf(self.staleness) else int(self.staleness)
        return {"policy": self.name, "staleness": s, "refresh_every_step": self.refresh_every_step}

    def describe(self) -> dict:
        return {**self.spec(), "clocks": {str(k): v for k, v in sorted(self.clocks.items())}}

    def state(self) -> dict:
        return {"clocks": {str(k): v for k, v in sorted(self.clocks.items())}}

    def restore(self, state: dict) -> None:
        """Takes back the clocks; raises ``ValueError`` on a worker id or clock out of range."""
        clocks = {}
        for k, v in dict(state.get("clocks", {})).items():
            worker = int(k)
            if worker < 0 or isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 2**53:
                raise ValueError(f"clock {v!r} of worker {k!r} is out of range")
            clocks[worker] = v
        self.clocks = clocks


class AsyncPolicy(SSPPolicy):
    """ASP: SSP with an infinite bound that refreshes the cache every step."""

    name = "async"

    def __init__(self):
        super().__init__(math.inf, refresh_every_step=True)

    def spec(self) -> dict:
        return {"policy": self.name}
