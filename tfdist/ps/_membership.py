"""Who takes part in the job, as one PS task sees it: liveness, membership and the job's batch counters.

Owns (PS side): the worker slots, when each worker was last heard, the done,
left, excluded (detected stragglers) and draining sets, joins, and the job's
progress (batches each worker sent, batches that changed the parameters, the
elastic engine's ``total_batches``). A worker is *live* while it heart-beats
within the timeout and has not said it is done or left; workers the job starts
with count as live (clock 0) for ``startup_grace_s`` after initialisation, so
the first steps wait for a slow starter instead of racing ahead.

Every method runs with the store's lock held. Methods named ``check_*``
only raise; the others change state and are called once every check of the
request passed. No sockets, no TensorFlow.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable

from tfdist.consistency.base import PolicyContext
from tfdist.ps import _schema as schema
from tfdist.ps._schema import Field
from tfdist.ps._waits import StoreError

__all__ = ["Membership"]

logger = logging.getLogger(__name__)


class Membership:
    """Liveness and membership of one PS task's workers.

    Args:
        num_workers: Worker slots (ids ``0 .. num_workers - 1``); ``None``:
            taken from the initialising worker's ``Init``.
        starting_workers: Workers the job starts with (``Init`` must say the
            same); ``None``: any number up to the slots.
        heartbeat_timeout_s: A worker not heard from for this long is not live.
        startup_grace_s: How long expected-but-unseen workers count as live.
        time_fn: Monotonic clock.
    """

    FIELDS = (
        Field("num_workers", schema.JOB_SIZE),
        Field("done_workers", schema.WORKERS, default=[]),
        Field("left_workers", schema.WORKERS, default=[]),
        Field("excluded", schema.WORKERS, default=[]),
        Field("draining", schema.WORKERS, default=[]),
        Field("total_batches", schema.OPTIONAL_COUNT),
        Field("worker_batches", schema.WORKER_COUNTS, default={}),
        Field("progress", schema.COUNT, default=0),
        Field("joins", schema.COUNT, default=0),
        Field("last_seen", schema.TIMES, checkpoint=False, status=False),
        Field("ever_seen", schema.WORKERS, checkpoint=False, status=False),
        Field("expected", schema.WORKERS, checkpoint=False, status=False),
        Field("init_time", schema.NUMBER, checkpoint=False, status=False),
    )

    def __init__(self, num_workers: int | None, starting_workers: int | None, heartbeat_timeout_s: float,
                 startup_grace_s: float, time_fn: Callable[[], float]):
        self.num_workers = num_workers
        self.starting_workers = starting_workers
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.startup_grace_s = startup_grace_s
        self.time = time_fn
        self.started = False
        self.init_time = 0.0
        self.expected: set[int] = set()
        self.last_seen: dict[int, float] = {}
        self.ever_seen: set[int] = set()
        self.done_workers: set[int] = set()
        #: Workers that left the barriers (``Leave``) and have not trained since.
        self.left_workers: set[int] = set()
        self.excluded: set[int] = set()
        self.draining: set[int] = set()
        self.total_batches: int | None = None
        #: Batches each worker has sent (applied, aggregated or dropped).
        self.worker_batches: dict[int, int] = {}
        #: Batches that changed the parameters (applied pushes, aggregated gradients).
        self.progress = 0
        self.joins = 0

    # ------------------------------------------------------------------ checks
    def check_member(self, worker: int, claimed_num_workers: int | None = None) -> None:
        """Raises unless ``worker`` is a worker of the job."""
        n = self.num_workers if self.num_workers is not None else claimed_num_workers
        if worker < 0 or (n is not None and worker >= n):
            raise StoreError(
                f"Worker {worker} is not a worker of this job (its workers are 0..{(n or 1) - 1}). "
                "Check the task's worker id and the cluster config every task uses.",
                grpc_code="PERMISSION_DENIED",
            )

    def check_members(self, workers: Iterable[int]) -> None:
        for w in sorted(workers):
            self.check_member(w)

    def check_starting_workers(self, num_workers: int | None) -> None:
        """An ``Init``'s worker count is at most the job's (no phantom workers counted live for the start-up
        grace: 1000 claimed on a 2-worker job made SSP reads wait for 998 workers that never come)."""
        if num_workers is None:
            return
        want = self.starting_workers
        if want is not None and num_workers > want:
            raise StoreError(
                f"Init says the job starts with {num_workers} worker(s); this parameter server was started for "
                f"{want}. Every task must use the same cluster config.", grpc_code="FAILED_PRECONDITION")
        if self.num_workers is not None and num_workers > self.num_workers:
            raise StoreError(
                f"Init says the job starts with {num_workers} worker(s); this parameter server has "
                f"{self.num_workers} worker slot(s). Every task must use the same cluster config.",
                grpc_code="FAILED_PRECONDITION")

    # ------------------------------------------------------------------ changes
    def start(self, num_workers: int | None, worker: int) -> None:
        """The job's first ``Init``: the workers it starts with count as live for the start-up grace."""
        if self.num_workers is None and num_workers is not None:
            self.num_workers = num_workers
        self.started = True
        self.init_time = self.time()
        self.expected = set(range(num_workers or 0))
        self.done_workers.discard(worker)

    def restart_after_restore(self) -> None:
        """A restored task: every worker not done gets a fresh start-up grace (they reconnect now)."""
        self.started = True
        self.init_time = self.time()
        self.expected = set(range(self.num_workers or 0)) - self.done_workers
        self.last_seen, self.ever_seen = {}, set()

    def touch(self, worker: int, on_join: Callable[[int], None] | None) -> None:
        """``worker`` was heard from; a worker new to the running job (or back) joins it (``on_join``)."""
        if worker < 0 or worker in self.done_workers:
            return
        self.left_workers.discard(worker)
        now = self.time()
        last = self.last_seen.get(worker)
        # An expected worker's first contact is the job's start (it counted as live at clock 0
        # meanwhile), not a join; anyone else new, or back after leaving, joins the running job.
        joining = worker in self.ever_seen or worker not in self.expected
        self.ever_seen.add(worker)
        if (last is None or now - last > self.heartbeat_timeout_s) and joining and on_join is not None:
            self.joins += 1
            self.last_seen.pop(worker, None)
            on_join(worker)
            logger.info("worker %d joined (live: %s)", worker, sorted(self.live() | {worker}))
        self.last_seen[worker] = now

    def live(self) -> frozenset[int]:
        now = self.time()
        live = {w for w, t in self.last_seen.items() if now - t <= self.heartbeat_timeout_s}
        if self.started and now - self.init_time <= self.startup_grace_s:
            live |= {w for w in self.expected
                     if w not in self.last_seen and w not in self.done_workers and w not in self.left_workers}
        return frozenset(live)

    def context(self, not_awaited: frozenset[int] = frozenset()) -> PolicyContext:
        """What the policy is told: the time, the live workers, those barriers do not wait for (detected
        stragglers, and ``not_awaited``)."""
        live = self.live()
        return PolicyContext(self.time(), live, frozenset((self.excluded | not_awaited) & live))

    def count_batch(self, worker: int, steps: int = 1) -> None:
        if worker >= 0:
            self.worker_batches[worker] = self.worker_batches.get(worker, 0) + steps

    @property
    def job_done(self) -> bool:
        return self.total_batches is not None and self.progress >= self.total_batches

    def reply_fields(self, worker: int) -> dict[str, Any]:
        """What every reply to ``worker`` says of its membership: ``leave`` (drained), ``job_done``."""
        info: dict[str, Any] = {}
        if worker in self.draining:
            info["leave"] = True
        if self.job_done:
            info["job_done"] = True
        return info

    def add_progress(self, batches: int) -> None:
        """Batches that changed the parameters (an applied push, an aggregated step)."""
        self.progress += batches

    def readmit_done(self, worker: int) -> None:
        """The chief initialises again: it is not done any more."""
        self.done_workers.discard(worker)

    def mark_done(self, worker: int) -> None:
        self.done_workers.add(worker)
        self.last_seen.pop(worker, None)

    def leave(self, worker: int) -> None:
        self.left_workers.add(worker)
        self.last_seen.pop(worker, None)

    def readmit(self, worker: int) -> None:
        """A worker (re)starts a session: it may come back after it said Done or was drained."""
        self.done_workers.discard(worker)
        self.draining.discard(worker)

    def control(self, drain, undrain, gone, total_batches) -> None:
        """The elastic engine's ``Control`` (checked by the caller with :meth:`check_members`)."""
        for w in gone or ():
            self.mark_done(w)
            self.draining.discard(w)
        if drain:
            self.draining |= drain
            logger.info("workers asked to leave: %s", sorted(self.draining))
        if undrain:
            self.draining -= undrain
        if total_batches is not None:
            self.total_batches = total_batches

    def set_excluded(self, excluded: set[int]) -> None:
        self.excluded = excluded

    # ------------------------------------------------------------------ schema
    def state(self) -> dict[str, Any]:
        return schema.snapshot(self, self.FIELDS)

    def checkpoint(self) -> dict[str, Any]:
        return schema.dump(self, self.FIELDS, "checkpoint")

    def status(self) -> dict[str, Any]:
        return {**schema.dump(self, self.FIELDS, "status"), "live_workers": sorted(self.live()),
                "job_done": self.job_done}
