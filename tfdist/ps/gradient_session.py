"""The gradient path's session (BSP, SyncReplicas): gradients per global step, the state snapshot, catch-up.

The worker side's slice of the gradient path in numpy, between the runtime
(:mod:`tfdist.strategies._gradient_path`) and the store's handlers
(:mod:`tfdist.ps._gradient_requests`).
"""

from __future__ import annotations

import logging
import time
from typing import Mapping

import numpy as np

from tfdist.errors import PSRejectedError, PSUnavailableError
from tfdist.ps.protocol import (
    CheckpointRequest,
    EpochLogsRequest,
    PushGradientsRequest,
    PutStateRequest,
    RestoreRequest,
)
from tfdist.ps.replies import PullReply
from tfdist.ps.session import WorkerSession

logger = logging.getLogger(__name__)

__all__ = ["GradientSession"]


class GradientSession(WorkerSession):
    """The gradient path: BSP and SyncReplicas (first M of N).

    ``global_step`` is the step whose gradient this worker computes next.
    :meth:`exchange` pushes the gradient to every PS task in parallel and
    returns the step's aggregate (the same bytes every worker gets); a
    dropped gradient still returns the aggregate when the PS kept it.
    :meth:`begin` reloads the full state snapshot (weights, optimizer slots,
    counters) when this worker has fallen behind; :meth:`end` uploads the
    snapshot when this worker completed a step on some PS task.
    """

    def __init__(self, *args, checkpoint_every_s: float | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._write_state_on: list[int] = []
        #: It joined a job already past its first step (its epochs are counted from there: ``job_epoch_logs``).
        self._joined_running_job = False
        self._resync_at_end = False
        #: The chief schedules a checkpoint of one state step on every task this often (a consistent cut).
        self.checkpoint_every_s = checkpoint_every_s if self.is_chief else None
        self._last_checkpoint_request = time.monotonic()
        self.stats.update({"steps": 0, "dropped": 0, "resyncs": 0, "waits": 0, "wait_seconds": 0.0,
                           "state_writes": 0})

    def initialize(self, local_values):
        values = super().initialize(local_values)
        if values is not None:  # joined a running job (or resumed from checkpoints): continue from its state
            if self.is_chief:
                values = self._align_restored_tasks(values)
            self.state.job_step = self.state.step
            self._joined_running_job = self.state.step > 0
        return values

    def _lookup_clock(self) -> int | None:
        return None  # the barrier orders reads: the previous step's rows are applied before any read of this one

    def _row_step(self) -> int | None:
        return self.state.step  # counted towards this step, applied when it completes

    def _align_restored_tasks(self, values):
        """The chief, when the tasks held values already (restored from checkpoints): one state step on all.

        A task restores its newest checkpoint; if the tasks' newest steps
        differ (one died before it wrote the last cut), every task is rolled
        back to the newest step all of them hold.
        """
        statuses = self.statuses()
        steps = {st.state_step for st in statuses}
        if len(steps) == 1:
            return values
        if all(st.restored_from is None for st in statuses):
            # No task came back from a checkpoint (the chief alone restarted): a step was in flight, some tasks
            # have closed it and some not yet. Nothing to roll back: load the newest state once all reach it.
            logger.info("worker %d: the parameter servers are at steps %s (a step in flight); loading step %d",
                        self.worker_id, sorted(steps), max(steps))
            return self.pull(min_state_step=max(steps))
        target = min(steps)
        logger.warning("worker %d: the parameter servers restored different steps %s; rolling every task back to "
                       "step %d", self.worker_id, sorted(steps), target)
        self.client.request_many({ps: RestoreRequest(self.worker_id, target) for ps in range(self.plan.num_ps)
                                  if statuses[ps].state_step != target})
        self.state.forget_incarnations()
        return self.pull(min_state_step=target)

    def _recover_from(self, statuses, restarted, local_values, deadline, as_reader) -> dict[str, np.ndarray]:
        """Gradient path: one consistent state on every task, then every worker loads it.

        The chief resets every task to its own state (weights and optimizer
        state at its global step: under BSP every worker's, under
        SyncReplicas at most the steps it was behind), so a task that came
        back from an older checkpoint, or empty, is never mixed with the
        others. The other workers wait (within ``reconnect_timeout_s``) until
        the chief has done so, then load that state.
        """
        n = self.plan.num_ps
        if not restarted:  # the tasks are the ones this worker knew: catch up with the newest state
            step = max(st.state_step for st in statuses.values())
        elif self.is_chief and local_values is not None:
            # Table rows live only on the PS: roll every task back to the checkpoint the restarted ones restored
            # (a consistent cut). Without tables, or without such a cut, reset to this worker's state.
            step = self._roll_back_to_restored_step(statuses, restarted) if self.tables else None
            if step is None:
                step = self.state.step
                parts = self._split({k: np.asarray(v) for k, v in local_values.items()})
                self.client.request_many({ps: self._init_request(ps, parts[ps], step=step, reset=True)
                                          for ps in range(n)})
                logger.warning("worker %d: reset every parameter server to this worker's state at step %d (ps:%s "
                               "restarted)", self.worker_id, step, restarted)
                if self.tables:
                    logger.warning("worker %d: the table rows of ps:%s are those of its checkpoint (or initial ones "
                                   "without a checkpoint); the other tasks' rows are newer", self.worker_id, restarted)
        else:
            step = self._wait_for_reset(set(range(n)), deadline)
        self.state.forget_incarnations()
        values = self.pull(min_state_step=step, as_reader=as_reader)
        self.state.job_step = self.state.step
        self._resync_at_end, self._write_state_on = False, []
        return values

    def _roll_back_to_restored_step(self, statuses, restarted) -> int | None:
        """The chief: every task back to the checkpoint step the restarted tasks restored; None if impossible."""
        restored = [statuses[ps].restored_from for ps in restarted]
        if any(step is None for step in restored):
            return None
        target = min(restored)
        others = [ps for ps in range(self.plan.num_ps) if statuses[ps].restored_from != target
                  or ps not in restarted]
        try:
            self.client.request_many({ps: RestoreRequest(self.worker_id, target) for ps in others})
        except PSRejectedError as e:
            logger.warning("worker %d: cannot roll every parameter server back to step %d (%s)", self.worker_id,
                           target, e)
            return None
        logger.warning("worker %d: rolled every parameter server back to its checkpoint of step %d (ps:%s "
                       "restarted); the job goes on from there", self.worker_id, target, restarted)
        return target

    def _wait_for_reset(self, tasks: set[int], deadline: float) -> int:
        """A worker other than the chief: waits until every task left the incarnation it knew, at one step."""
        old = list(self.state.incarnations)
        while True:
            statuses = self.statuses()
            moved = all(st.incarnation != old[ps] and st.initialized for ps, st in enumerate(statuses))
            steps = {st.state_step for st in statuses}
            if moved and len(steps) == 1:
                return steps.pop()
            if time.monotonic() > deadline:
                raise PSUnavailableError(
                    f"Worker {self.worker_id}: a parameter server restarted and the chief did not reset the tasks "
                    f"to one state within ps.reconnect_timeout_s={self.reconnect_timeout_s:g} s (steps {sorted(steps)}).")
            time.sleep(0.1)

    def _schedule_checkpoint(self) -> None:
        """The chief, every ``checkpoint_every_s``: every task checkpoints the state of the next global step."""
        if self.checkpoint_every_s is None or time.monotonic() - self._last_checkpoint_request < self.checkpoint_every_s:
            return
        at = max(self.state.step, self.state.job_step) + 1
        replies = self.client.request_many({ps: CheckpointRequest(self.worker_id, at) for ps in range(self.plan.num_ps)})
        if all(reply.scheduled for reply in replies.values()):
            self._last_checkpoint_request = time.monotonic()
        else:  # a task is past that step already (the others raced ahead): try again at the next step
            logger.info("worker %d: checkpoint of step %d not scheduled on every task; trying the next step",
                        self.worker_id, at)

    def _note(self, replies) -> None:
        ordered = [replies[i] for i in range(self.plan.num_ps)]
        steps = [r.state_step for r in ordered if isinstance(r, PullReply)]
        if steps:  # a state pull: continue from the snapshot's step
            self.state.step = min(steps)
        self._note_membership(ordered)
        self.state.job_step = max([self.state.job_step] + [r.global_step or 0 for r in ordered])

    def job_epoch_logs(self, epoch: int, logs: Mapping[str, float]) -> tuple[int, dict[str, float]]:
        """This worker's logs of its ``epoch``-th epoch end; returns ``(the epoch they counted for, the job's logs)``
        (their mean, from PS task 0)."""
        reply = self.client.request(0, EpochLogsRequest(self.worker_id, epoch, dict(logs), self._joined_running_job))
        return reply.epoch, dict(reply.logs)

    def catch_up(self, as_reader: bool = False) -> dict[str, np.ndarray] | None:
        """The job's latest state snapshot, if it is newer than this worker's state (else ``None``).

        Asks every PS task which state it holds, so a worker that fell behind
        without knowing it (a dropped backup after ``fit``) catches up too;
        waits (bounded) until every task holds the newest one.
        """
        latest = max(st.state_step for st in self.statuses())
        if latest <= self.state.step:
            return None
        values = self.pull(min_state_step=latest, as_reader=as_reader)
        self.stats["resyncs"] += 1
        return values

    def begin(self) -> dict[str, np.ndarray] | None:
        """Reloads the state snapshot if other workers have moved on."""
        if self.state.job_step <= self.state.step:
            return None
        values = self.pull(min_state_step=self.state.job_step)
        self.stats["resyncs"] += 1
        return values

    def exchange(self, grads: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Pushes gradients for ``global_step``; returns that step's aggregate."""
        start = time.perf_counter()
        parts = self._split({k: np.asarray(v) for k, v in grads.items()})
        step = self.state.step
        replies = self._request_many(
            {ps: PushGradientsRequest(self.worker_id, step, parts[ps], self.state.incarnations[ps])
             for ps in range(self.plan.num_ps)})
        self._note_membership(list(replies.values()))
        self.stats["bytes_pushed"] += sum(g.nbytes for g in grads.values())
        dropped = any(r.dropped for r in replies.values())
        resync = any(r.resync for r in replies.values())
        self.stats["dropped"] += int(dropped)
        self.stats["waits"] += int(any(r.waited for r in replies.values()))  # this worker waited for others
        self.state.job_step = max([self.state.job_step] + [r.global_step for r in replies.values()])
        found = {k: v for r in replies.values() for k, v in r.values.items()}
        aggregate = {}
        for key, grad in grads.items():
            shards = self.plan.shards_of(key)
            if resync or any(s.key not in found for s in shards):
                aggregate[key] = np.zeros_like(grad)  # end() reloads the state right after it is applied
            elif len(shards) == 1 and shards[0].rows is None:
                aggregate[key] = found[shards[0].key]
            else:
                aggregate[key] = np.concatenate([found[s.key] for s in shards], axis=0)
        if resync:
            self.state.job_step = max(self.state.job_step, step + 1)
            self._resync_at_end = True
        self._write_state_on = [ps for ps, r in replies.items() if r.write_state]
        self.state.step = step + 1
        self.stats["steps"] += 1
        self.stats["wait_seconds"] += time.perf_counter() - start
        self.stats["bytes_pulled"] += sum(a.nbytes for a in aggregate.values())
        return aggregate

    def end(self, state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """Finishes a step: uploads this worker's state where it completed the step.

        Returns:
            The state snapshot to load instead, when this step's aggregate was
            no longer available (the worker was too far behind): the step's
            update is then replaced by the job's current state.
        """
        self._schedule_checkpoint()
        if self._resync_at_end:
            self._resync_at_end = False
            self._write_state_on = []
            values = self.pull(min_state_step=self.state.job_step)
            self.stats["resyncs"] += 1
            return values
        if not self._write_state_on:
            return None
        parts = self._split({k: np.asarray(v) for k, v in state.items()})
        self._request_many(
            {ps: PutStateRequest(self.worker_id, self.state.step, parts[ps], self.state.incarnations[ps])
             for ps in self._write_state_on})
        self.stats["state_writes"] += 1
        self._write_state_on = []
        return None
