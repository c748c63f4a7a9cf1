"""Bounded waits of one PS task's store: the one place a request may block, and every bound on it.

A request that must wait (an SSP read ahead of the bound, a gradient for a
step that is not complete, a capped update rate) asks :meth:`BoundedWaits.wait_for`
with a ``decide`` function, which is re-asked under the store's lock until
it says go. Bounds: the caller's budget and ``max_wait_s`` (→ ``ABORTED``,
the policy's wait ran out), the caller going away (→ ``CANCELLED``), the
store closing (→ ``UNAVAILABLE``); at most ``max_waiters`` counted waits at
once (more → ``RESOURCE_EXHAUSTED`` at once, before anything changed).

Owns: the waiters count, the closing flag and the capacity slots
(``max_updates_per_s``). No sockets, no TensorFlow.
"""

from __future__ import annotations

import threading
from typing import Callable

from tfdist.consistency.base import PushAction
from tfdist.ps.protocol import RequestError

__all__ = ["BoundedWaits", "Wait", "WAIT_TIMEOUT_CODE", "Cancelled", "never", "StoreError"]

#: gRPC status of a consistency-policy wait that ran out of time (the PS itself is fine).
WAIT_TIMEOUT_CODE = "ABORTED"

Cancelled = Callable[[], bool]


def never() -> bool:
    """A caller that never goes away (in-process calls)."""
    return False


class StoreError(RequestError):
    """A request the store refuses; ``grpc_code`` names the gRPC status. Nothing was changed."""


class Wait:
    """A wait/go answer in the shape :meth:`BoundedWaits.wait_for` reads (as the policies' decisions)."""

    __slots__ = ("action", "reason")

    def __init__(self, wait: bool, reason: str):
        self.action = PushAction.WAIT if wait else PushAction.APPLY
        self.reason = reason


class BoundedWaits:
    """Waits on the store's condition variable, bounded in time and in number.

    Args:
        cond: The store's condition variable (its lock is held by every caller).
        time_fn: Monotonic clock (tests pass a fake one).
        max_wait_s: Longest any call waits (the job's RPC timeout).
        max_waiters: Most counted waits at once.
        max_updates_per_s: Capacity cap (emulates a slow PS); ``None``: none.
        on_waited_read: Called when a read that had to wait may go on (a counter).
    """

    def __init__(self, cond: threading.Condition, time_fn: Callable[[], float], max_wait_s: float,
                 max_waiters: int, max_updates_per_s: float | None = None,
                 on_waited_read: Callable[[], None] = lambda: None):
        self.cond = cond
        self.time = time_fn
        self.max_wait_s = max_wait_s
        self.max_waiters = max_waiters
        self.max_updates_per_s = max_updates_per_s
        self.waiters = 0
        self.closing = False
        self._next_slot = 0.0
        self._on_waited_read = on_waited_read

    def wait_for(self, decide, timeout: float | None, what: str, cancelled: Cancelled = never,
                 counted: bool = True):
        """Re-asks ``decide`` until it does not say WAIT (lock held), within the bounds.

        With ``counted``, a wait takes one of ``max_waiters`` places and is
        refused (``RESOURCE_EXHAUSTED``) when none is free; the caller must
        not have changed anything before asking.
        """
        decision = decide()
        if decision.action is not PushAction.WAIT:
            return decision
        if counted and self.waiters >= self.max_waiters:
            raise StoreError(
                f"Too many calls are waiting on this parameter server ({self.waiters}; at most "
                f"{self.max_waiters}): refused instead of queued. Waiting to {what}: {decision.reason}.",
                grpc_code="RESOURCE_EXHAUSTED",
            )
        bound = self.max_wait_s if timeout is None else min(timeout, self.max_wait_s)
        deadline = self.time() + bound
        if counted:
            self.waiters += 1
        try:
            while True:
                if self.closing:
                    raise StoreError("The parameter server is stopping.", grpc_code="UNAVAILABLE")
                if cancelled():
                    raise StoreError(f"The caller went away while waiting to {what}.", grpc_code="CANCELLED")
                remaining = deadline - self.time()
                if remaining <= 0:
                    raise StoreError(
                        f"Timed out after {bound:g} s waiting to {what}: "
                        f"{decision.reason or 'the consistency policy said wait'}. The parameter server is "
                        "healthy; raise ps.rpc_timeout_s if workers are expected to lag this much.",
                        grpc_code=WAIT_TIMEOUT_CODE,
                    )
                # Re-check at least every 0.2 s: liveness changes by the passage of time.
                self.cond.wait(timeout=min(remaining, 0.2))
                decision = decide()
                if decision.action is not PushAction.WAIT:
                    if what == "pull":
                        self._on_waited_read()
                    return decision
        finally:
            if counted:
                self.waiters -= 1

    def admit(self, timeout: float | None, cancelled: Cancelled = never) -> None:
        """Waits for this update's slot when ``max_updates_per_s`` caps the rate (lock released while waiting).

        The slot is reserved before the wait, so concurrent callers get consecutive slots.
        """
        if not self.max_updates_per_s:
            return
        slot = max(self.time(), self._next_slot)
        self._next_slot = slot + 1.0 / self.max_updates_per_s
        self.wait_for(lambda: Wait(self.time() < slot, "a slot of the PS's capacity (ps.max_updates_per_s)"),
                      timeout, "get an update slot", cancelled)

    def close(self) -> None:
        """Every waiting call fails with ``UNAVAILABLE``; no call waits after (lock held)."""
        self.closing = True
        self.cond.notify_all()
