"""The interface every consistency policy implements.

A policy is a pure object: it keeps clocks and counters, never does I/O, and
answers the parameter server's questions with typed decisions. The server
carries the decisions out (apply a push, drop it, or make the caller wait).
Policies are unit-tested with a fake clock: time and the set of live workers
arrive in a :class:`PolicyContext`.

Two exchange paths share this interface (DESIGN.md §4.1):

* **update path** (ASP, SSP, DTSSP): workers push the additive change their
  own optimizer made; the policy decides when a worker may start a clock
  (``on_pull``) and whether a push is applied (``on_push``).
* **gradient path** (BSP, SyncReplicas): workers push gradients for a global
  step; the policy decides whether a gradient counts (``on_gradient``) and
  when a step is complete (``step_complete``). Every worker applies the same
  aggregate with its own optimizer, so workers stay identical.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

__all__ = [
    "PolicyContext",
    "PushAction",
    "PushDecision",
    "PullDecision",
    "GradientAction",
    "GradientDecision",
    "ConsistencyPolicy",
]


@dataclass(frozen=True)
class PolicyContext:
    """What the server knows when it asks.

    Attributes:
        now: The time, in seconds.
        live: Workers that are heart-beating and not done.
        excluded: Live workers a straggler detector flagged: barriers stop
            waiting for them until they recover (their work still counts
            when it arrives in time).
    """

    now: float = 0.0
    live: frozenset[int] = field(default_factory=frozenset)
    excluded: frozenset[int] = field(default_factory=frozenset)

    @property
    def awaited(self) -> frozenset[int]:
        """Live workers that barriers wait for."""
        return self.live - self.excluded


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


class GradientAction(enum.Enum):
    """What the server does with a gradient pushed for a global step."""

    ACCUMULATE = "accumulate"  # counts towards the step
    STALE = "stale"  # the step is already complete: dropped
    FUTURE = "future"  # the worker is ahead of the global step: refused
    DUPLICATE = "duplicate"  # this worker already contributed to the step: refused


@dataclass(frozen=True)
class GradientDecision:
    action: GradientAction
    reason: str = ""


class ConsistencyPolicy:
    """Base class: decides, per push and per pull, apply / drop / wait.

    Subclasses override the hooks they need.
    """

    #: Name used in configs and logs.
    name = "base"
    #: Update path: workers pull fresh values with every push (ASP) instead of
    #: only when the staleness bound needs them.
    refresh_every_step: bool = False
    #: Update path: the bound ``s`` on how far a worker may run ahead of the
    #: slowest (``math.inf``: never wait).
    staleness: float = math.inf

    @property
    def path(self) -> str:
        """``"update"`` or ``"gradient"``: which exchange path workers use (the mode's descriptor says)."""
        from tfdist.consistency.modes import MODES

        mode = MODES.get(self.name)
        return mode.path if mode is not None else "update"

    @property
    def exchange(self):
        """The :class:`~tfdist.consistency.modes.ExchangePath` of :attr:`path` (its facts, named)."""
        from tfdist.consistency.modes import EXCHANGE_PATHS

        return EXCHANGE_PATHS[self.path]

    # ----------------------------------------------------------- update path
    def on_push(self, worker: int, clock: int, ctx: PolicyContext) -> PushDecision:
        """Called before a push from ``worker`` made at ``clock`` is applied."""
        return PushDecision(PushAction.APPLY)

    def on_pull(self, worker: int, clock: int, ctx: PolicyContext) -> PullDecision:
        """Called before a read by ``worker`` about to start ``clock``."""
        return PullDecision(False)

    def on_applied(self, worker: int, clock: int, ctx: PolicyContext, loss: float | None = None) -> None:
        """Called after a push was applied; ``clock`` is the worker's completed steps."""

    # --------------------------------------------------------- gradient path
    def on_gradient(self, worker: int, step: int, global_step: int, contributors: frozenset[int],
                    ctx: PolicyContext) -> GradientDecision:
        raise NotImplementedError(f"{self.name} does not aggregate gradients")

    def step_complete(self, contributors: frozenset[int], ctx: PolicyContext) -> bool:
        raise NotImplementedError(f"{self.name} does not aggregate gradients")

    def read_may_wait(self) -> bool:
        """Whether ``on_pull`` can ever say wait (SSP with a finite bound). ASP's reads never wait."""
        return False

    def clock_fields(self, ctx: PolicyContext) -> dict:
        """Clock information every reply carries (SSP: ``min_clock``, ``staleness``). Defaults to none."""
        return {}

    def on_read(self, worker: int, clock: int):
        """Update path: ``worker`` reads before starting step ``clock`` (so it has completed ``clock`` steps).

        Returns:
            ``None``, or a callable that takes the read back if it is then
            refused (its wait ran out): it restores ``worker``'s own clock
            only, and only if nothing moved it since, so what other workers
            did meanwhile is kept.
        """
        return None

    def clock_of(self, worker: int) -> int | None:
        """The clock the policy holds for ``worker``, told to it on reads (``None``: the policy keeps none)."""
        return None

    def aggregation_size(self) -> int:
        """Gradient path: ``M``, the gradients whose sum is the step's mean (Keras scaled each loss by 1/M)."""
        raise NotImplementedError(f"{self.name} does not aggregate gradients")

    # ------------------------------------------------------------ membership
    def on_join(self, worker: int, ctx: PolicyContext) -> None:
        """Called when ``worker`` is first heard from, or again after it left.

        ``ctx.live`` does not include ``worker`` yet. Elastic jobs rely on it:
        a joiner must not hold the others back (see SSP's clock adoption).
        """

    def on_step_boundary(self, ctx: PolicyContext) -> None:
        """Gradient path: called when the job starts and after every completed step.

        Policies that size their barrier by the number of workers fix it here,
        so membership changes take effect at step boundaries.
        """

    # --------------------------------------------------------------- common
    def spec(self) -> dict:
        """Name and parameters: what workers and PS tasks must agree on."""
        return {"policy": self.name}

    def describe(self) -> dict:
        """Current state for status RPCs and logs (JSON-able)."""
        return self.spec()

    def state(self) -> dict:
        """What a PS checkpoint keeps of the policy beyond its spec (JSON-able); defaults to nothing."""
        return {}

    def restore(self, state: dict) -> None:
        """Takes back what :meth:`state` returned (a PS restarting from a checkpoint)."""
