"""The gradient path's requests to a PS task's store (BSP, SyncReplicas): one slice of :class:`ParameterStore`.

``PushGradients`` (a gradient for the current global step, answered with the
step's aggregate), ``PutState`` (the state snapshot lagging workers re-sync
from), ``EpochLogs`` (the job's epoch logs) and ``Checkpoint(at_step)`` (the
chief's consistent cut). Mixed into :class:`~tfdist.ps.store.ParameterStore`:
the same lock, the same order (check everything, then change), the facts in
the components (:class:`~tfdist.ps._barrier.GradientBarrier` and the others).
"""

from __future__ import annotations

import numpy as np

from tfdist.consistency.base import GradientAction
from tfdist.ps import _shard_state
from tfdist.ps._waits import Cancelled, StoreError, never
from tfdist.ps.protocol import EpochLogsRequest, PushGradientsRequest, PutStateRequest
from tfdist.ps.replies import EpochLogsReply, GradientsReply, PutStateReply

__all__ = ["GradientPathRequests"]


class GradientPathRequests:
    """``push_gradients``, ``put_state``, ``epoch_logs``, ``capture_at`` of :class:`ParameterStore`."""

    def push_gradients(self, req: PushGradientsRequest, timeout: float | None = None,
                       cancelled: Cancelled = never) -> GradientsReply:
        """Contributes gradients to global step ``req.step``; returns that step's aggregate.

        Blocks (bounded) until the step is complete. A gradient for a step
        that is already complete is dropped; its sender still gets the
        step's aggregate if it is in the recent history, otherwise
        ``resync=True`` (it must reload the state snapshot). A gradient for a
        future step, or a second one from the same worker, is refused.

        Returns:
            The step's aggregate as the reply's values; ``dropped``,
            ``resync``, ``global_step``, ``waited`` (the step was not complete
            when this gradient arrived: the worker waited for others),
            ``write_state`` (this worker completed the step and should upload
            the state after applying it).
        """
        worker, step = req.worker, req.step
        self.variables.check_finite(req.grads, worker, "gradient")
        with self._cond:
            self._check_worker_request(worker, req.incarnation, "gradient")
            self.variables.check_tensors(req.grads, trainable_only=True)
            self.waits.admit(timeout, cancelled)
            decision = self.policy.on_gradient(worker, step, self.global_step,
                                               frozenset(self.barrier.contributors), self._ctx())
            if decision.action in (GradientAction.FUTURE, GradientAction.DUPLICATE):
                raise StoreError(f"Gradient refused: {decision.reason}.", grpc_code="FAILED_PRECONDITION")
            self._touch(worker)
            dropped = decision.action is GradientAction.STALE
            waited = False
            self.members.count_batch(worker)
            if dropped:
                self.stats["dropped"] += 1
            else:
                self.stats["bytes_in"] += self.barrier.contribute(worker, req.grads)
                self._maybe_complete(worker)
                waited = self.global_step <= step
                if waited:
                    self.stats["waits"] += 1
                # A contributor's wait is not counted against max_waiters: at most one per worker.
                # If it runs out, the gradient still counts towards the step (the error says so).
                self.waits.wait_for(lambda: self._step_wait(step), timeout,
                                    f"complete step {step} (this worker's gradient is counted)", cancelled,
                                    counted=False)
            common = dict(dropped=dropped, global_step=self.global_step, step=step, reason=decision.reason or None,
                          waited=not dropped and waited, **self._reply_fields(worker))
            if step not in self.barrier.history:
                return GradientsReply(resync=True, write_state=False, **common)
            aggregate, closer = self.barrier.history[step]
            self.stats["bytes_out"] += sum(a.nbytes for a in aggregate.values())
            return GradientsReply(resync=False, write_state=closer == worker and not dropped, values=aggregate,
                                  **common)

    def _step_wait(self, step: int):
        if self.global_step <= step:
            self._maybe_complete(None)  # the live set may have shrunk
        return self.barrier.step_wait(step, self._ctx().awaited)

    def _maybe_complete(self, closer: int | None) -> None:
        aggregated = self.barrier.complete_if_ready(self.policy, self._ctx(), closer, self._apply_step_rows)
        if not aggregated:
            return
        self.stats["aggregations"] += 1
        self.stats["gradients_aggregated"] += aggregated
        self.members.add_progress(aggregated)
        self.policy.on_step_boundary(self._ctx())
        self._cond.notify_all()

    def epoch_logs(self, req: EpochLogsRequest, timeout: float | None = None,
                   cancelled: Cancelled = never) -> EpochLogsReply:
        """A worker's logs at the end of an epoch; answers with the job's (gradient path, see ``_epoch_logs``).

        Waits (bounded) until every live worker reported the epoch. If the
        wait runs out, the report still counts (the error says so).
        """
        with self._cond:
            self._check_worker_request(req.worker, None, "gradient")
            self._touch(req.worker)
            epoch = self.epoch_logs_barrier.report(req.worker, req.epoch, req.logs, req.joined)
            self._cond.notify_all()
            self.waits.wait_for(lambda: self.epoch_logs_barrier.decide(
                epoch, lambda reported: self.policy.required(reported, self.members.context())), timeout,
                                f"share epoch {epoch}'s logs (this worker's logs are counted)", cancelled,
                                counted=False)
            logs, workers = self.epoch_logs_barrier.answer(epoch)
            return EpochLogsReply(dict(logs), workers, epoch)

    def _apply_step_rows(self, key: str, rows: np.ndarray, grads: np.ndarray, lr: float | None) -> None:
        self.table_shards.tables[key].apply(rows, grads, lr)

    def put_state(self, req: PutStateRequest) -> PutStateReply:
        """Replaces the state snapshot with the one a worker had after ``req.step`` steps (gradient path).

        Older snapshots than the stored one are ignored (``stored: False``).
        """
        self.variables.check_finite(req.tensors, req.worker, "state value")
        with self._cond:
            self._check_worker_request(req.worker, req.incarnation, "gradient")
            self.variables.check_tensors(req.tensors)
            self._touch(req.worker)
            if req.step <= self.state_step and self.state_step > 0:
                return PutStateReply(False, self.state_step)
            self.variables.write(req.tensors)
            previous = self.state_step
            self.barrier.store_state(req.step)
            self.stats["state_writes"] += 1
            self._maybe_capture(previous)
            self._cond.notify_all()
            return PutStateReply(True, self.state_step)

    def capture_at(self, worker: int, step: int) -> bool:
        """Gradient path: capture a snapshot when the state reaches ``step``; False if it is already past it."""
        with self._cond:
            self.members.check_member(worker)
            self._require_initialized()
            self._require_path("gradient")
            if self.state_step > step:
                return False
            if self.state_step == step:
                self._captured.append(_shard_state.capture(self))
            else:
                self._capture_at.add(step)
            return True
