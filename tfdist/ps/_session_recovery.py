"""How a worker session recovers from a lost or restarted PS task (one slice of the session).

:meth:`SessionRecovery.recover` reconnects within ``ps.reconnect_timeout_s``;
the chief initialises a task that came back empty (with the variables that
joined later, named as such), the others wait for it; then the job's values
are read. The gradient path overrides ``_recover_from`` (one consistent state
step on every task).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Mapping

import numpy as np

from tfdist.errors import PSUnavailableError
from tfdist.ps.protocol import LeaveRequest, StatusRequest, WaitInitRequest

__all__ = ["SessionRecovery"]

logger = logging.getLogger(__name__)


class SessionRecovery:
    """``recover`` and its parts, of :class:`~tfdist.ps.session.WorkerSession`."""

    def recover(self, cause: Exception, local_values: Mapping[str, np.ndarray] | None = None,
                as_reader: bool = False) -> dict[str, np.ndarray]:
        """Carries on after a PS task was lost or restarted; returns the values to load.

        Tries (with backoff, within ``reconnect_timeout_s``) until every PS
        task answers. A task that restarted from a checkpoint holds its
        restored state; one that restarted *without* a checkpoint is
        initialised again from the chief's current values (``local_values``,
        given on the chief; the other workers wait for it, within the same
        bound), so no task ever serves a fresh, untrained shard. Then every
        variable is pulled. What this worker sent in the call that failed is
        lost on the task that restarted (at most one step; the tasks that
        did not restart may already have applied it). ``as_reader``: pull as
        an evaluator does (a worker that left training stays out).

        Raises:
            PSUnavailableError: a task did not come back within ``reconnect_timeout_s``.
        """
        start = time.monotonic()
        deadline = start + self.reconnect_timeout_s
        logger.warning("worker %d: lost a parameter server (%s); reconnecting (ps.reconnect_timeout_s=%g)",
                       self.worker_id, cause, self.reconnect_timeout_s)
        self._base = None
        beating = self._pause_heartbeat()
        try:
            statuses = self._wait_all_answer(deadline, cause)
            restarted = [ps for ps in range(self.plan.num_ps)
                         if statuses[ps].incarnation != self.state.incarnations[ps]]
            if restarted:
                self.client.forget_streams()  # connections to the tasks before their restart are dead
            values = self._recover_from(statuses, restarted, local_values, deadline, as_reader)
        finally:
            if beating:
                self._resume_heartbeat()
        self.stats["recoveries"] += 1
        logger.warning("worker %d: training goes on after %.1f s (restarted: %s)", self.worker_id,
                       time.monotonic() - start, [f"ps:{ps}" for ps in restarted] or "none")
        return values

    def _recover_from(self, statuses, restarted, local_values, deadline, as_reader) -> dict[str, np.ndarray]:
        """Update path: tasks that came back empty get the chief's values; every variable is pulled."""
        for ps in restarted:
            if statuses[ps].initialized:
                logger.warning("worker %d: ps:%d restarted and restored its checkpoint of step %s",
                               self.worker_id, ps, statuses[ps].restored_from)
        empty = [ps for ps in restarted if not statuses[ps].initialized]
        if empty:
            self._reinitialize(empty, local_values, deadline)
            if self.tables and self.is_chief:
                logger.warning("worker %d: ps:%s restarted without a checkpoint: its rows of the tables %s are lost "
                               "and start again from their initial values (set ps.checkpoint_dir)", self.worker_id,
                               empty, sorted(self.tables))
        self.state.forget_incarnations()  # learnt again from the replies
        if restarted and not as_reader:
            self._rejoin(restarted)  # a restored checkpoint may be from before variables joined
        return self.pull(as_reader=as_reader)

    def _pause_heartbeat(self) -> bool:
        """While recovering, the worker does not count for barriers: no heart-beat, and ``Leave`` where it reaches.

        (Otherwise a barrier on a task that is fine would wait for this
        worker's gradient until the RPC deadline.) Its next call after the
        recovery brings it back as a joiner. Returns whether it was beating.
        """
        beating = self._hb_thread is not None and self._hb_thread.is_alive() and not self._hb_stop.is_set()
        self.stop_heartbeat()
        if self._hb_thread is not None and self._hb_thread.is_alive():
            self._hb_thread.join(timeout=2 * (self._hb_interval or 0) + 1.0)
        if self.worker_id < 0:
            return beating
        request = LeaveRequest(self.worker_id)
        for ps in range(self.plan.num_ps):
            try:
                self.client.request(ps, request, timeout=2.0)
            except Exception:  # the lost task, most likely; the others heard it
                pass
        return beating

    def _resume_heartbeat(self) -> None:
        self._hb_stop = threading.Event()
        self._hb_thread = self._heartbeat_thread()
        self._hb_thread.start()

    def _wait_all_answer(self, deadline: float, cause: Exception, setting: str = "reconnect_timeout_s"
                         ) -> dict[int, dict]:
        """Every task's brief status, once all answer (backoff up to ``deadline``, which ``ps.<setting>`` set)."""
        delay = 0.1
        while True:
            remaining = deadline - time.monotonic()
            try:
                return self.client.request_all(StatusRequest(brief=True), timeout=max(0.5, min(5.0, remaining)))
            except PSUnavailableError as e:
                if time.monotonic() + delay > deadline:
                    raise PSUnavailableError(
                        f"A parameter server did not come back within {getattr(self, setting):g} s "
                        f"(ps.{setting}): {e}. It was lost with: {cause}") from e
                time.sleep(delay)
                delay = min(2 * delay, 2.0)

    def _reinitialize(self, tasks: list[int], local_values: Mapping[str, np.ndarray] | None, deadline: float
                      ) -> None:
        """Tasks that restarted with no state: the chief initialises them again; the others wait for it."""
        if self.is_chief and local_values is not None:
            parts = self._split({k: np.asarray(v) for k, v in local_values.items()})
            self.client.request_many({ps: self._init_request(ps, parts[ps], step=self.state.step) for ps in tasks})
            logger.warning("worker %d: ps:%s restarted without a checkpoint; initialised again from this worker's "
                           "current values (set ps.checkpoint_dir to restore instead)", self.worker_id, tasks)
            return
        for ps in tasks:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise PSUnavailableError(
                        f"Parameter server ps:{ps} restarted without a checkpoint and the chief did not "
                        f"initialise it again within ps.reconnect_timeout_s={self.reconnect_timeout_s:g} s.")
                wait = min(remaining, 5.0)
                joined = set(self.joined)  # (sent again after: the chief may not have joined them all)
                specs = tuple(sp for sp in self._shard_specs(ps) if self._var_key[sp.key] not in joined)
                reply = self.client.request(ps, WaitInitRequest(self.worker_id, wait, specs, self.policy_spec,
                                                                 self.num_workers), timeout=wait + 5.0)
                if reply.initialized:
                    break
