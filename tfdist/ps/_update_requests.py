"""The update path's requests to a PS task's store (ASP, SSP, DTSSP): one slice of :class:`ParameterStore`.

``Push`` (a worker's update, added as the policy decides), ``PushPull`` (a push
and a read in one call, for modes whose reads never wait) and the read wait
(a reader's clock told to the policy, which may hold the read back; used by
``Pull`` and ``Lookup`` where :attr:`ExchangePath.reads_carry_clock`). Mixed
into :class:`~tfdist.ps.store.ParameterStore`: the same lock, the same order
(check everything, then change), the facts in the components
(:class:`~tfdist.ps._variables.DenseVariables`, the policy's clocks,
:class:`~tfdist.ps._membership.Membership`).
"""

from __future__ import annotations

from typing import Any, Callable

from tfdist.consistency.base import PushAction
from tfdist.ps._waits import Cancelled, StoreError, Wait, never
from tfdist.ps.protocol import PushPullRequest, PushRequest
from tfdist.ps.replies import PushPullReply, PushReply

__all__ = ["UpdatePathRequests"]


class UpdatePathRequests:
    """``push``, ``push_pull`` and the read wait of :class:`ParameterStore`."""

    def _check_push(self, req: PushRequest) -> None:
        self._check_worker_request(req.worker, req.incarnation, "update")
        self.variables.check_tensors({k: v for k, v in req.deltas.items() if k not in req.rows})
        self.variables.check_rows(req.deltas, req.rows)

    def push(self, req: PushRequest, timeout: float | None = None, cancelled: Cancelled = never) -> PushReply:
        """Adds the deltas to the stored values, as the policy decides.

        ``req.clock`` is the number of steps the worker has completed with
        this push; ``req.steps`` how many local steps (batches) the deltas sum
        (``strategy.exchange_every``); the job's batch counters advance by it.
        """
        self.variables.check_finite(req.deltas, req.worker, "update")
        with self._cond:
            self._check_push(req)
            return self._apply_push(req, timeout, cancelled)

    def push_pull(self, req: PushPullRequest, consumer: Callable[[PushPullReply], Any],
                  timeout: float | None = None, cancelled: Cancelled = never) -> Any:
        """A push and a read in one call, for policies whose reads never wait (ASP).

        Calls ``consumer(reply)`` under the lock after the push (the reply's
        values are the live arrays); ``reply.unchanged`` is True when the
        push landed right on ``req.base_version`` and nothing landed after it
        (the caller then knows the values: its snapshot plus its delta).
        """
        push = req.push
        self.variables.check_finite(push.deltas, push.worker, "update")
        with self._cond:
            self._check_push(push)
            keys = self._read_keys(req.keys)
            if self.policy.read_may_wait():
                raise StoreError(
                    f"PushPull is for jobs whose reads never wait; this job runs {self.policy.spec()}. "
                    "Send Push, then Pull.", grpc_code="FAILED_PRECONDITION",
                )
            result = self._apply_push(push, timeout, cancelled)
            unchanged = (req.base_version is not None and result.applied
                         and result.previous_version == req.base_version)
            return self._read_locked(push.worker, keys, lambda read: consumer(PushPullReply(read, result, unchanged)))

    def _apply_push(self, req: PushRequest, timeout: float | None, cancelled: Cancelled) -> PushReply:
        """Applies a checked push (lock held); waits only before changing anything."""
        worker = req.worker
        self.waits.admit(timeout, cancelled)
        decision = self.waits.wait_for(lambda: self.policy.on_push(worker, req.clock, self._ctx()), timeout, "push",
                                       cancelled)
        if decision.action is PushAction.DROP:
            self._touch(worker)
            self.members.count_batch(worker, req.steps)
            self.stats["dropped"] += 1
            return PushReply(False, True, self.version, reason=decision.reason, **self._reply_fields(worker))
        nbytes = self.variables.add(req.deltas, req.rows, worker)  # refuses an overflowing sum, changing nothing
        self._touch(worker)
        self.members.count_batch(worker, req.steps)
        self.stats["bytes_in"] += nbytes
        previous = self.version - 1  # add() bumped it
        self.stats["pushes"] += 1
        self.members.add_progress(req.steps)
        self.policy.on_applied(worker, req.clock, self._ctx(), req.loss)
        self._maybe_capture(self.progress - req.steps)
        self._cond.notify_all()
        return PushReply(True, False, self.version, previous_version=previous, **self._clock_info(),
                         **self._reply_fields(worker))

    def _read_wait(self, worker: int, clock: int, timeout: float | None, cancelled: Cancelled) -> None:
        """Update path: tells the policy the reader's clock (``on_read``), then waits as it says (lock held).

        A read that is refused (its wait ran out, the caller went away) puts
        back the reader's own clock only: what other workers did meanwhile stays.
        """
        undo = self.policy.on_read(worker, clock) if worker >= 0 else None
        try:
            self.waits.wait_for(lambda: self._pull_decision(worker, clock), timeout, "pull", cancelled)
        except StoreError:
            if undo is not None:
                undo()
            raise

    def _pull_decision(self, worker: int, clock: int):
        decision = self.policy.on_pull(worker, clock, self._ctx())
        return Wait(decision.wait, decision.reason)
