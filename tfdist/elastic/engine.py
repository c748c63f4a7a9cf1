"""The autoscaling engine: measures the job on the parameter servers, asks the policies, acts.

Every ``elastic.poll_s`` seconds the engine reads PS task 0's counters
(``Status``: batches per worker, batches applied, live workers) and

1. notices workers that ended (a crash is a non-zero exit: the PS is told at
   once so barriers stop waiting, and the job goes on without it; while
   autoscaling, the engine starts a fresh worker to keep the size it chose).
   Whether to go on is the launcher's rule for every job,
   :func:`tfdist.cluster.failure.decide_worker_failure`: under
   ``launch.on_worker_failure: auto`` or ``continue`` an elastic job goes on
   without any worker; under ``stop`` a crash stops it;
2. notices joiners: a started worker *counts* once the PS has a batch from it
   (it warmed up on ``elastic.warmup_batches`` local batches first);
3. closes a *measurement window* every ``elastic.interval_batches`` global
   batches, if every worker counted for the whole window (no one warming up
   or leaving): aggregate throughput ``R`` in batches/s and each worker's own;
4. feeds the window to the :class:`~tfdist.elastic.ScalingPolicy` (add ``K``
   workers, stay, or go back to the best size) and to the
   :class:`~tfdist.elastic.ReplacementPlanner` (start a spare for a
   persistent straggler; remove the straggler once the spare has joined);
5. carries decisions out through an :class:`~tfdist.elastic.actuators.Actuator`:
   new workers get ``TFDIST_WARMUP_BATCHES``; leaving workers are asked to
   leave through the PS (their ``ElasticCallback`` stops ``fit`` at a batch
   boundary) and stopped after ``elastic.drain_timeout_s`` if they did not.

Every decision is written, with the numbers behind it, to the log and to
``decisions`` (and a JSONL file when ``log_path`` is given); ``timeline``
has one row per window. The job ends when the PS reports
``elastic.total_batches`` applied and every worker has left, or when every
worker has ended on its own.
"""

from __future__ import annotations

import json
import logging
import math
import time
import types
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Protocol

from tfdist import constants
from tfdist.cluster.failure import decide_worker_failure
from tfdist.config import JobConfig
from tfdist.elastic.actuators import Actuator
from tfdist.elastic.policy import Action, ScalingConfig, ScalingPolicy, utility_from_dict
from tfdist.elastic.replacement import KEEP_SPARE, REMOVE, START_SPARE, ReplacementPlanner
from tfdist.errors import LaunchError, PSUnavailableError
from tfdist.straggler.ewma import EwmaConfig

__all__ = ["ElasticEngine", "EngineResult", "PSControl", "StatusSource", "scaling_config", "WorkerRecord"]

logger = logging.getLogger(__name__)

#: Crashes before the PS is initialised that the engine answers with a restart (then it gives up).
MAX_CRASHES_BEFORE_START = 3


class StatusSource(Protocol):
    """What the engine needs from the parameter servers (``PSControl`` over gRPC)."""

    def status(self) -> dict[str, Any]: ...

    def control(self, **request: Any) -> None: ...


class PSControl:
    """The engine's gRPC link to the parameter servers.

    Args:
        config: The job (PS addresses, timeouts).
        token: The job token.
    """

    def __init__(self, config: JobConfig, token: str):
        from tfdist.ps.admin import AdminClient

        self.client = AdminClient.for_job(config, token)

    def status(self) -> dict[str, Any]:
        """PS 0's brief ``Status``: its counters and policy, without the list of variable specs."""
        return self.client.status(0, brief=True, timeout=10.0).to_dict()

    def control(self, **request: Any) -> None:
        """``Control`` to every PS task: ``drain``, ``undrain``, ``gone`` (worker ids), ``total_batches``."""
        self.client.control(**request, timeout=10.0)

    def close(self) -> None:
        self.client.close()


def scaling_config(config: JobConfig) -> ScalingConfig:
    """The :class:`ScalingConfig` an ``elastic:`` config section describes."""
    e = config.elastic
    return ScalingConfig(
        min_workers=e.min_workers, max_workers=e.max_workers, step=e.step, interval_batches=e.interval_batches,
        min_samples=e.min_samples, efficiency_threshold=e.efficiency_threshold,
        price_per_worker_s=e.price_per_worker_s, utility=utility_from_dict(e.utility),
    )


@dataclass
class WorkerRecord:
    """What the engine knows about one started worker."""

    worker: int
    role: str  # "initial", "scale_up", "spare", "restart"
    started: float
    base_batches: int  # the PS's count for this id when it was started (ids are reused)
    counted: float | None = None  # when its first batch reached the PS
    leaving: float | None = None  # when it was asked to leave
    reason: str = ""

    def to_dict(self, t0: float, ended: float, code: int | None) -> dict[str, Any]:
        def rel(t):
            return None if t is None or t == math.inf else round(t - t0, 3)

        return {"worker": self.worker, "role": self.role, "started": rel(self.started), "joined": rel(self.counted),
                "asked_to_leave": rel(self.leaving), "ended": rel(ended), "exit": code, "reason": self.reason}


@dataclass
class _Window:
    start: float
    progress: int
    batches: dict[int, int]
    members: frozenset[int]


@dataclass
class EngineResult:
    """What happened: the summary a benchmark or notebook reads."""

    completion_s: float
    worker_seconds: float
    settled_s: float | None
    settled_workers: int | None
    progress: int
    timeline: list[dict] = field(default_factory=list)
    decisions: list[dict] = field(default_factory=list)
    exits: dict[int, list] = field(default_factory=dict)
    #: One entry per worker process: role, started/joined/asked_to_leave/ended (s from the job's start), exit.
    workers: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ElasticEngine:
    """Runs one elastic job: scaling, straggler replacement, crash handling.

    Args:
        config: The job config (``elastic`` section).
        actuator: Starts and stops workers.
        source: The parameter servers' counters (:class:`PSControl`).
        clock: Time source. Defaults to ``time.monotonic``.
        log_path: Also append every decision as a JSON line here.
        started: Workers already running at the start (default: the first
            ``elastic.initial_workers``, which the engine then starts itself
            when ``start_initial`` is true).
    """

    def __init__(
        self,
        config: JobConfig,
        actuator: Actuator,
        source: StatusSource,
        clock: Callable[[], float] = time.monotonic,
        log_path: str | None = None,
    ):
        self.config = config
        self.e = config.elastic
        self.actuator = actuator
        self.source = source
        self.clock = clock
        self.log_path = log_path
        self.scaling = ScalingPolicy(scaling_config(config), initial_workers=self.e.initial_workers) \
            if self.e.autoscale else None
        self.planner = ReplacementPlanner(
            max_spares=self.e.max_spares if self.e.replace_stragglers else 0,
            ewma=EwmaConfig(alpha=self.e.ewma_alpha, threshold=self.e.straggler_threshold, window=1),
        )
        self.target = self.e.initial_workers
        self.workers: dict[int, WorkerRecord] = {}
        self.decisions: list[dict] = []
        self.timeline: list[dict] = []
        self.exits: dict[int, list] = {}
        self._window: _Window | None = None
        self._t0: float | None = None
        self._worker_seconds = 0.0
        self._settled_s: float | None = None
        self._last_status: dict[str, Any] = {}
        self._done_logged = False
        self._history: list[dict] = []
        self._early_crashes = 0

    # ------------------------------------------------------------------ log
    def _record(self, kind: str, message: str, level: int = logging.INFO, **numbers: Any) -> dict:
        entry = {"t": round(self._now(), 3), "kind": kind, "message": message, **numbers}
        self.decisions.append(entry)
        logger.log(level, "[elastic] %s", message)
        if self.log_path:
            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(entry, default=str) + "\n")
        return entry

    def _now(self) -> float:
        return 0.0 if self._t0 is None else self.clock() - self._t0

    # ------------------------------------------------------------ workers
    def _batches(self, status: Mapping[str, Any]) -> dict[int, int]:
        return {int(w): int(n) for w, n in (status.get("worker_batches") or {}).items()}

    def _free_slot(self) -> int:
        used = set(self.workers) | self.actuator.running()
        for w in range(1, self.e.max_workers) if 0 in used else range(self.e.max_workers):
            if w not in used:
                return w
        raise LaunchError(f"No free worker slot: all {self.e.max_workers} (elastic.max_workers) are in use.")

    def _start(self, role: str, reason: str, worker: int | None = None, warmup: bool = True) -> int:
        worker = self._free_slot() if worker is None else worker
        env = {constants.ENV_WARMUP_BATCHES: str(self.e.warmup_batches if warmup else 0)}
        base = self._batches(self._last_status).get(worker, 0)
        self.actuator.start_worker(worker, env)
        self.workers[worker] = WorkerRecord(worker, role, self.clock(), base, reason=reason)
        return worker

    def _drain(self, worker: int, reason: str) -> None:
        rec = self.workers.get(worker)
        if rec is None or rec.leaving is not None:
            return
        rec.leaving = self.clock()
        rec.reason = reason
        self.source.control(drain=[worker])

    @property
    def last_status(self) -> Mapping[str, Any]:
        """The parameter servers' status read by the latest :meth:`poll` (read-only).

        PS 0's ``Status`` answer (``progress``, ``total_batches``,
        ``worker_batches``, ``initialized``, ``job_done``, ...); empty before
        the first poll that reached the PS. Hooks passed to :meth:`run` as
        ``on_poll`` read it, e.g. ``engine.last_status.get("progress", 0)``.
        """
        return types.MappingProxyType(self._last_status)

    @property
    def started_at(self) -> float | None:
        """``clock()`` time the run started (the zero of every ``t`` in the log); None before :meth:`run`."""
        return self._t0

    def active(self) -> list[int]:
        """Workers started and not asked to leave."""
        return sorted(w for w, r in self.workers.items() if r.leaving is None)

    def counted(self) -> set[int]:
        return {w for w, r in self.workers.items() if r.counted is not None and r.leaving is None}

    # --------------------------------------------------------------- start
    def start(self) -> None:
        """Starts the initial workers (no warm-up: nothing runs yet) and tells the PS the job's work."""
        self._t0 = self.clock()
        for _ in range(self.e.initial_workers):
            self._start("initial", "initial size", warmup=False)
        self._record("start", f"job starts with {self.e.initial_workers} worker(s) "
                     f"(min {self.e.min_workers}, max {self.e.max_workers}, step {self.e.step}, "
                     f"window {self.e.interval_batches} batches)", workers=self.active(),
                     autoscale=self.e.autoscale, total_batches=self.e.total_batches)
        self._total_sent = False

    def _send_total(self) -> None:
        if self.e.total_batches and not self._total_sent:
            try:
                self.source.control(total_batches=self.e.total_batches)
                self._total_sent = True
            except PSUnavailableError:
                pass  # the PS is still starting; try at the next poll

    # ---------------------------------------------------------------- poll
    def poll(self) -> bool:
        """One round: read the PS, handle exits and joins, close windows, act. False when the job is over."""
        now = self.clock()
        self._send_total()
        self._handle_exits(now)
        try:
            status = self.source.status()
        except PSUnavailableError as e:
            if not self.workers:
                return False
            raise LaunchError(f"The elastic engine lost the parameter servers: {e}") from e
        self._last_status = status
        batches = self._batches(status)
        for rec in self.workers.values():
            if rec.counted is None and batches.get(rec.worker, 0) > rec.base_batches and not self._done_logged:
                rec.counted = now
                self._record("join", f"worker {rec.worker} ({rec.role}) joined after {now - rec.started:.1f} s "
                             "of start-up and warm-up", worker=rec.worker, role=rec.role,
                             startup_s=round(now - rec.started, 3))
        self._force_stop_stale_drains(now)
        if status.get("job_done"):
            if not self._done_logged:
                self._done_logged = True
                for rec in self.workers.values():  # ElasticCallback makes them leave; stop any that do not
                    if rec.leaving is None:
                        rec.leaving, rec.reason = now, "job done"
                self._record("job_done", f"the job's {status.get('total_batches')} batches are applied; "
                             "waiting for the workers to leave", progress=status.get("progress"))
            return bool(self.workers)
        self._window_step(now, status, batches)
        return bool(self.workers)

    def _handle_exits(self, now: float) -> None:
        for worker, code in self.actuator.poll().items():
            rec = self.workers.pop(worker, None)
            if rec is None:
                continue
            self._worker_seconds += now - rec.started
            self.exits.setdefault(worker, []).append(code)
            self._history.append(rec.to_dict(self._t0, now, code))
            self.planner.forget(worker)
            if rec.leaving is not None or self._done_logged:
                self._record("left", f"worker {worker} left, exit {code} ({rec.reason or 'job done'})",
                             worker=worker, exit=code)
                continue
            if code == 0:
                self._record("finished", f"worker {worker} finished its training on its own (exit 0)",
                             worker=worker, exit=code)
                continue
            decision = decide_worker_failure(self.config, worker)
            if decision.stop:
                self._record("crash", f"worker {worker} crashed (exit {code}); stopping the job: {decision.reason}",
                             level=logging.ERROR, worker=worker, exit=code)
                raise LaunchError(f"Worker {worker} crashed (exit {code}); {decision.reason}. See its log.")
            try:
                self.source.control(gone=[worker])
            except PSUnavailableError:
                pass
            self._record("crash", f"worker {worker} crashed (exit {code}); the job goes on without it",
                         worker=worker, exit=code, workers=self.active())
            self._window = None
            before_init = not self._last_status.get("initialized", False)
            if before_init:
                self._early_crashes += 1
                if self._early_crashes > MAX_CRASHES_BEFORE_START:
                    raise LaunchError(
                        f"Workers crashed {self._early_crashes} times before the job started (worker {worker} "
                        f"exit {code}); not restarting again. See the workers' logs.")
            if before_init or (self.scaling is not None and len(self.active()) < self.target):
                new = self._start("restart", f"replaces crashed worker {worker}", warmup=not before_init)
                why = ("the job had not started (the PS is not initialised)" if before_init
                       else f"to keep {self.target} worker(s)")
                self._record("restart", f"starting worker {new} in place of worker {worker}: {why}",
                             worker=new, replaces=worker, target=self.target)

    def _force_stop_stale_drains(self, now: float) -> None:
        for rec in list(self.workers.values()):
            if rec.leaving is not None and now - rec.leaving > self.e.drain_timeout_s:
                self._record("stop", f"worker {rec.worker} did not leave within {self.e.drain_timeout_s:g} s "
                             "(elastic.drain_timeout_s); stopping it", worker=rec.worker)
                self.actuator.stop_worker(rec.worker)
                rec.leaving = math.inf  # stopped: wait for its exit only

    # -------------------------------------------------------------- windows
    def _window_step(self, now: float, status: Mapping[str, Any], batches: dict[int, int]) -> None:
        members = frozenset(self.counted())
        stable = all(r.counted is not None for r in self.workers.values() if r.leaving is None) and \
            not any(r.leaving is not None for r in self.workers.values())
        progress = int(status.get("progress", 0))
        w = self._window
        if not stable or not members:
            self._window = None
            return
        if w is None or w.members != members:
            self._window = _Window(now, progress, dict(batches), members)
            return
        done = progress - w.progress
        if done < self.e.interval_batches or now <= w.start:
            return
        dt = now - w.start
        rate = done / dt
        per_worker = {m: (batches.get(m, 0) - w.batches.get(m, 0)) / dt for m in members}
        row = {"t": round(self._now(), 3), "workers": len(members), "throughput": rate, "batches": done,
               "seconds": dt, "per_worker": {str(k): v for k, v in sorted(per_worker.items())},
               "progress": progress}
        self.timeline.append(row)
        self._window = _Window(now, progress, dict(batches), members)
        self.planner.observe(per_worker)
        if self.scaling is not None:
            self.scaling.observe(len(members), rate, done)
        self._decide(status)

    def _decide(self, status: Mapping[str, Any]) -> None:
        total = status.get("total_batches")
        remaining = None if not total else max(int(total) - int(status.get("progress", 0)), 0)
        if self.scaling is not None:
            d = self.scaling.decide(remaining)
            entry = d.to_dict()
            if d.settled and self._settled_s is None:
                self._settled_s = self._now()
                self._record("settled", f"settles at {d.target} worker(s) after {self._settled_s:.1f} s",
                             decision=entry, workers=d.target)
            if d.action is Action.ADD:
                new = [self._start("scale_up", d.reason) for _ in range(d.target - len(self.active()))]
                self.scaling.applied(d.target)
                self.target = d.target
                self._record("scale_up", f"adding {len(new)} worker(s) {new}: {d.reason}", decision=entry)
                return
            if d.action is Action.REMOVE:
                leaving = [w for w in sorted(self.active(), reverse=True) if w != 0][: len(self.active()) - d.target]
                for w in leaving:
                    self._drain(w, "scale down")
                self.scaling.applied(d.target)
                self.target = d.target
                self._record("scale_down", f"removing worker(s) {leaving}: {d.reason}", decision=entry,
                             workers=leaving)
                return
            self._record("stay", d.reason, level=logging.DEBUG, decision=entry)
        for action in self.planner.plan(joined=self.counted()):
            if action.kind == START_SPARE:
                try:
                    spare = self._start("spare", action.reason)
                except LaunchError as e:
                    self.planner.cancel_spare(action.worker)
                    self._record("spare_refused", f"cannot start a spare for worker {action.worker}: {e}")
                    continue
                self.planner.spare_started(spare, replaces=action.worker)
                self._record("spare", f"starting spare {spare}: {action.reason}", action=action.to_dict(),
                             spare=spare)
            elif action.kind == REMOVE:
                self._drain(action.worker, "replaced by a spare")
                self._record("replace", action.reason, action=action.to_dict())
            elif action.kind == KEEP_SPARE:
                self._record("keep_spare", action.reason, action=action.to_dict())

    # ----------------------------------------------------------------- run
    def run(self, timeout: float | None = None,
            on_poll: Callable[["ElasticEngine"], None] | None = None,
            timeout_setting: str = "launch.job_timeout_s") -> EngineResult:
        """Starts the job and polls until it is over (or ``timeout``, which raises naming ``timeout_setting``).

        ``on_poll(engine)`` runs after every poll (a hook for watchdogs,
        experiments and tests; it may raise to abort the job).
        """
        self.start()
        deadline = None if timeout is None else self.clock() + timeout
        try:
            while self.poll():
                if on_poll is not None:
                    on_poll(self)
                if deadline is not None and self.clock() > deadline:
                    raise LaunchError(f"The elastic job did not finish within {timeout:g} s ({timeout_setting}); "
                                      f"workers still running: {sorted(self.workers)}. Stopped all tasks.")
                time.sleep(self.e.poll_s)
        finally:
            self._close()
        return self.result()

    def _close(self) -> None:
        now = self.clock()
        for rec in self.workers.values():
            self._worker_seconds += now - rec.started
            self._history.append(rec.to_dict(self._t0, now, None))
        self.actuator.close()
        self.workers.clear()

    def result(self) -> EngineResult:
        return EngineResult(
            completion_s=self._now(),
            worker_seconds=self._worker_seconds,
            settled_s=self._settled_s,
            settled_workers=None if self.scaling is None else self.scaling.settled_size,
            progress=int(self._last_status.get("progress", 0)),
            timeline=list(self.timeline),
            decisions=list(self.decisions),
            exits=dict(self.exits),
            workers=list(self._history),
        )
