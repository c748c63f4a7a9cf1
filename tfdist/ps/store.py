"""The parameter store of one PS task: the requests' order of checks and changes, over its components.

No sockets here: the server (``tfdist.ps.server``) parses every request into
a typed request (:mod:`tfdist.ps.protocol`) and calls these methods, which
return typed replies (:mod:`tfdist.ps.replies`). Every method checks the whole
request against the store's state first (initialised, a worker of the job,
known variables, dtypes and shapes, finite values and sums, the exchange
path) and only then changes anything, under one lock: a refused request
leaves the store exactly as it was (values, versions, clocks, membership,
the done set, counters) — a wait that runs out included.

The store is components, each the one owner of its facts (docs/architecture.md):

* :class:`~tfdist.ps._variables.DenseVariables` — specs, values, version,
  the non-finite policy; the update path's additions;
* :class:`~tfdist.ps._barrier.GradientBarrier` — global step, state step,
  the current step's sum and contributors, recent aggregates (gradient path);
* :class:`~tfdist.ps._table_shards.TableShards` — PS-resident tables;
* :class:`~tfdist.ps._membership.Membership` — liveness, membership, the
  job's batch counters and the elastic engine's controls;
* :class:`~tfdist.ps._waits.BoundedWaits` — every wait and its bounds;
* the consistency policy (clocks, the barrier's size), chosen by the chief;
* :class:`~tfdist.ps._epoch_logs.EpochLogBarrier` — the job's epoch logs (gradient path).

Each exchange path's requests and the tables' requests are slices of this
class in their own modules (``_update_requests``, ``_gradient_requests``,
``_table_requests``).
Each component lists its fields once (:mod:`tfdist.ps._schema`); ``state()``,
checkpoint capture and ``status()`` are derived from those lists, and
:meth:`ParameterStore.restore` parses and validates a whole checkpoint
before it assigns anything (see :mod:`tfdist.ps._shard_state`).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from tfdist import constants
from tfdist.consistency import MODES, policy_from_spec
from tfdist.errors import ConfigError
from tfdist.consistency.base import ConsistencyPolicy, PolicyContext
from tfdist.ps import _shard_state
from tfdist.ps._barrier import AGGREGATE_HISTORY, GradientBarrier
from tfdist.ps._epoch_logs import EpochLogBarrier
from tfdist.ps._rendezvous import Rendezvous
from tfdist.ps._gradient_requests import GradientPathRequests
from tfdist.ps._membership import Membership
from tfdist.ps._table_requests import TableRequests
from tfdist.ps._update_requests import UpdatePathRequests
from tfdist.ps._table_shards import TableShards
from tfdist.ps._variables import DenseVariables, all_finite
from tfdist.ps._waits import WAIT_TIMEOUT_CODE, BoundedWaits, Cancelled, StoreError, Wait, never
from tfdist.ps.replies import (
    ControlReply,
    ExtendReply,
    InitReply,
    PullReply,
    WaitInitReply,
)
from tfdist.ps.protocol import (
    ControlRequest,
    ExtendRequest,
    InitRequest,
    PullRequest,
    WaitInitRequest,
)

__all__ = ["ParameterStore", "StoreError", "all_finite", "AGGREGATE_HISTORY", "WAIT_TIMEOUT_CODE"]

logger = logging.getLogger(__name__)


class ParameterStore(UpdatePathRequests, GradientPathRequests, TableRequests):
    """Variables owned by one PS task, guarded by one condition variable.

    Args:
        policy: The consistency policy. ``None`` lets the initialising worker
            choose it (its ``Init`` carries the policy spec).
        heartbeat_timeout_s: A worker not heard from for this long is not live.
        startup_grace_s: How long expected-but-unseen workers count as live.
        time_fn: Monotonic clock; tests pass a fake one.
        max_updates_per_s: Apply at most this many pushes/gradients per
            second (emulates a PS of limited capacity); ``None``: no cap.
        num_workers: Worker slots of the job (ids ``0 .. num_workers - 1``);
            requests from other ids are refused. ``None``: taken from the
            initialising worker's ``Init``.
        max_wait_s: Longest any call waits (the job's RPC timeout). Defaults
            to 30 s.
        max_waiters: Most calls waiting at once, gradient contributors aside.
            Defaults to ``num_workers + 4`` (16 while unknown).
        starting_workers: Workers the job starts with; an ``Init`` that says
            more is refused. Defaults to ``None`` (up to ``num_workers``).
        max_reply_bytes: Largest reply a lookup may need (the message limit);
            ``None``: unchecked.

    Liveness and elastic membership (joins, ``Done``, silence, drains, the
    job's total work): :class:`~tfdist.ps._membership.Membership`.
    """

    def __init__(
        self,
        policy: ConsistencyPolicy | None = None,
        heartbeat_timeout_s: float = constants.DEFAULT_HEARTBEAT_TIMEOUT_S,
        startup_grace_s: float = 120.0,
        time_fn: Callable[[], float] = time.monotonic,
        max_updates_per_s: float | None = None,
        num_workers: int | None = None,
        max_wait_s: float = 30.0,
        max_waiters: int | None = None,
        starting_workers: int | None = None,
        max_reply_bytes: int | None = None,
    ):
        self.policy = policy
        self._time = time_fn
        self._cond = threading.Condition()
        self.max_reply_bytes = max_reply_bytes
        self.waits = BoundedWaits(self._cond, time_fn, max_wait_s,
                                  max_waiters if max_waiters is not None else (num_workers or 12) + 4,
                                  max_updates_per_s, on_waited_read=lambda: self.stats.__setitem__(
                                      "waits", self.stats["waits"] + 1))  # reads that had to wait
        self.members = Membership(num_workers, starting_workers, heartbeat_timeout_s, startup_grace_s, time_fn)
        self.variables = DenseVariables()
        self.barrier = GradientBarrier()
        self.epoch_logs_barrier = EpochLogBarrier()
        #: Workers waiting in a read for a state snapshot newer than the store's (gradient path): step wanted.
        self._reading_ahead: dict[int, int] = {}
        self.rendezvous = Rendezvous()  # strategy.barrier / strategy.reduce across workers (not checkpointed)
        self.table_shards = TableShards()
        #: Identifies this run of the PS task's state: random per start, new after a reset or a
        #: roll-back (replies carry it; a worker that sees it change re-syncs).
        self.incarnation = secrets.randbits(48)
        #: The checkpoint step this store was restored from (``None``: initialised by a worker).
        self.restored_from: int | None = None
        #: Capture a checkpoint snapshot each time the shard's step crosses a multiple of this
        #: (``ps.checkpoint_every_steps``); the writer collects them with :meth:`take_captured`.
        self.checkpoint_every_steps: int | None = None
        self._captured: list[tuple[int, dict[str, Any], dict[str, np.ndarray]]] = []
        #: Gradient path: state steps at which to capture a snapshot (the chief's time-based checkpoints).
        self._capture_at: set[int] = set()
        self.stats = dict.fromkeys(("pushes", "pulls", "dropped", "bytes_in", "bytes_out", "waits", "aggregations",
                                    "gradients_aggregated", "state_writes", "row_pushes", "row_writes",
                                    "set_excluded"), 0)

    # ------------------------------------------------------ facts, read by callers (each has one owner)
    initialized = property(lambda self: self.variables.initialized)
    version = property(lambda self: self.variables.version)
    nonfinite = property(lambda self: self.variables.nonfinite)
    initialized_by = property(lambda self: self.variables.initialized_by)
    global_step = property(lambda self: self.barrier.global_step)
    state_step = property(lambda self: self.barrier.state_step)
    num_workers = property(lambda self: self.members.num_workers)
    done_workers = property(lambda self: self.members.done_workers)
    worker_batches = property(lambda self: self.members.worker_batches)
    progress = property(lambda self: self.members.progress)
    joins = property(lambda self: self.members.joins)
    job_done = property(lambda self: self.members.job_done)
    max_wait_s = property(lambda self: self.waits.max_wait_s)
    _waiters = property(lambda self: self.waits.waiters)

    def _ctx(self) -> PolicyContext:
        # Workers waiting at an epoch end send no gradient meanwhile: no barrier waits for them. Nor for a worker
        # waiting to read a state snapshot of a step past the one being aggregated: it counts that step as done
        # (a joiner whose first gradient was stale, told of a later step by another task) and sends its next
        # gradient for a later step, so waiting for it here would hold both until the RPC deadline.
        ahead = frozenset(w for w, step in self._reading_ahead.items() if step > self.global_step)
        return self.members.context(self.epoch_logs_barrier.waiting() | ahead)

    def _touch(self, worker: int) -> None:
        joined = self.policy is not None and self.initialized
        self.members.touch(worker, (lambda w: self.policy.on_join(w, self._ctx())) if joined else None)

    def _reply_fields(self, worker: int) -> dict[str, Any]:
        return {"incarnation": self.incarnation, **self.members.reply_fields(worker)}

    def _clock_info(self) -> dict[str, Any]:
        return {"global_step": self.global_step, **self.policy.clock_fields(self._ctx())}

    # ---------------------------------------------------------------- init
    def init(self, req: InitRequest) -> InitReply:
        """Stores the initial values, policy and non-finite policy unless already initialised.

        Returns:
            ``initialized_here`` True if this call initialised the store;
            False if it already was (the caller should then pull). Specs and
            policy are checked either way.
        """
        self.variables.check_finite(req.values, req.worker, "initial value", req.nonfinite)
        with self._cond:
            self.members.check_member(req.worker, req.num_workers)
            self.members.check_starting_workers(req.num_workers)
            if self.initialized:
                self.variables.check_same_specs(req.specs)
                self.table_shards.check_same(req.tables)
                self._check_same_policy(req.policy)
                if req.nonfinite != self.nonfinite:
                    raise StoreError(
                        f"This worker asks for ps.nonfinite: {req.nonfinite}; the job runs {self.nonfinite} "
                        "(chosen by the chief at the start). Use the same config on every task.",
                        grpc_code="FAILED_PRECONDITION")
                if req.reset:
                    return self._reset(req)
                self.members.readmit_done(req.worker)
                self._touch(req.worker)
                return self._init_reply(False)
            policy = self.policy
            if req.policy is not None:
                policy = policy_from_spec(req.policy, req.num_workers or 1)  # parse validated the spec
            if policy is None:
                raise StoreError("No consistency policy: the initialising worker must send one.")
            self._check_aggregation(policy, req.num_workers)
            tables = TableShards.allocate(req.tables, req.nonfinite)
            # -- every check passed: apply
            self.table_shards.install(tables)
            self.policy = policy
            self.variables.initialize(req.specs, req.values, req.worker, req.nonfinite, req.joined)
            self.barrier.restart(req.step)
            self.members.start(req.num_workers, req.worker)
            self._touch(req.worker)
            self.policy.on_step_boundary(self._ctx())
            self._cond.notify_all()
        total = sum(s.nbytes for s in req.specs)
        logger.info("initialised by worker %d: %d variables, %d bytes, policy %s, non-finite values: %s",
                    req.worker, len(req.specs), total, self.policy.spec(), self.nonfinite)
        return self._init_reply(True)

    def extend(self, req: ExtendRequest) -> ExtendReply:
        """Variables created after the job's first step join it; returns the job's values of every key sent.

        A key the task does not hold yet is added with the sender's value
        (the first sender's value is the job's); one it holds with the same
        spec is left as it is; one with another spec refuses the whole request.
        """
        self.variables.check_finite(req.values, req.worker, "initial value")
        with self._cond:
            self._check_worker_request(req.worker, req.incarnation)
            new = self.variables.check_join(req.specs, req.worker)
            if new:
                self.variables.join(new, req.values)  # copies first: a value too large to copy changes nothing
                self._touch(req.worker)
                self._cond.notify_all()
                logger.info("worker %d: %d variable(s) joined the job after its first step (%s)", req.worker,
                            len(new), ", ".join(s.key for s in new[:3]) + (", ..." if len(new) > 3 else ""))
            values = {s.key: self.variables.values[s.key].copy() for s in req.specs}
            return ExtendReply(self.version, self.incarnation, tuple(s.key for s in new), values)

    def _init_reply(self, here: bool) -> InitReply:
        return InitReply(here, self.version, self.global_step, self.incarnation, self.state_step)

    def _check_aggregation(self, policy: ConsistencyPolicy, num_workers: int | None) -> None:
        """A gradient-path job cannot aggregate more gradients per step than it has workers."""
        n = num_workers or self.num_workers
        mode = MODES.get(policy.name)  # (a policy a test builds by hand may have no descriptor)
        try:
            if n is not None and mode is not None:
                mode.check_workers(policy.spec(), n)
        except ConfigError as e:
            raise StoreError(f"{policy.name}: no step could ever complete. {e}", grpc_code="FAILED_PRECONDITION") \
                from None

    def _reset(self, req: InitRequest) -> InitReply:
        """The chief replaces the values of an initialised store and restarts its step (lock held, checked)."""
        if req.worker != 0:
            raise StoreError(f"Only the chief (worker 0) may reset a parameter server; worker {req.worker} asked.",
                             grpc_code="PERMISSION_DENIED")
        # -- every check passed: apply (the tables stay: no worker holds their rows)
        self.variables.write(req.values)
        self._restart_step(req.step)
        self.incarnation = secrets.randbits(48)
        self._touch(req.worker)
        self._cond.notify_all()
        logger.warning("reset by worker %d to its values at step %d (incarnation %d)", req.worker, req.step,
                       self.incarnation)
        return self._init_reply(True)

    def _restart_step(self, step: int) -> None:
        self.barrier.restart(step)
        if self.policy is not None:
            self.policy.on_step_boundary(self._ctx())

    def wait_init(self, req: WaitInitRequest, timeout: float | None = None, cancelled: Cancelled = never
                  ) -> WaitInitReply:
        """Waits (bounded) until initialised; then checks the caller's specs/policy and re-admits it."""
        with self._cond:
            if req.worker is not None:
                self.members.check_member(req.worker, req.num_workers)
            if not self.initialized:
                budget = req.timeout_s if timeout is None else min(req.timeout_s, timeout)
                try:
                    self.waits.wait_for(lambda: Wait(not self.initialized, "not initialised yet"), budget,
                                        "initialise", cancelled)
                except StoreError as e:
                    if e.grpc_code != WAIT_TIMEOUT_CODE:
                        raise
                    return WaitInitReply(False, self.version, self.global_step, self.incarnation)
            if req.specs is not None:
                self.variables.check_same_specs(req.specs)
            self._check_same_policy(req.policy)
            if req.worker is not None:
                self.members.readmit(req.worker)
            return WaitInitReply(True, self.version, self.global_step, self.incarnation, self.state_step)

    def _check_same_policy(self, spec: dict | None) -> None:
        if spec is not None and self.policy is not None and spec != self.policy.spec():
            raise StoreError(
                f"This worker uses consistency {spec}, but the job runs {self.policy.spec()} "
                "(chosen by the chief). Use the same strategy settings on every worker.",
                grpc_code="FAILED_PRECONDITION",
            )

    # ------------------------------------------------------------ validation
    def _require_initialized(self) -> None:
        if not self.initialized:
            # UNAVAILABLE (retry later), not a refusal: workers only ever see it from a task that
            # restarted without a checkpoint, and recover by waiting for the chief to initialise it.
            raise StoreError(
                "The parameter server has no variables yet: the chief (or worker 0) "
                "initialises them at its first step.",
                grpc_code="UNAVAILABLE",
            )

    def _require_path(self, path: str) -> None:
        if self.policy.path != path:
            raise StoreError(
                f"This job runs {self.policy.name!r} ({self.policy.path} path); a {path}-path request "
                "does not apply. Use the same strategy on every worker.",
                grpc_code="FAILED_PRECONDITION",
            )

    def _check_incarnation(self, incarnation: int | None) -> None:
        """A request computed against another incarnation of this task's state is refused (lock held)."""
        if incarnation is not None and incarnation != self.incarnation:
            raise StoreError(
                f"This request was computed against incarnation {incarnation} of this parameter server's "
                f"state; it now holds incarnation {self.incarnation} (it restarted, or the chief reset or rolled "
                "it back). Nothing was applied: re-sync (pull) and go on.", grpc_code="UNAVAILABLE")

    def _check_worker_request(self, worker: int, incarnation: int | None = None, path: str | None = None) -> None:
        """The checks every training request starts with (lock held)."""
        self._require_initialized()
        self._check_incarnation(incarnation)
        self.members.check_member(worker)
        if path is not None:
            self._require_path(path)

    def _read_keys(self, keys: Iterable[str] | None) -> list[str]:
        if keys is None:
            return list(self.variables.values)
        self.variables.check_keys(keys)
        return list(keys)

    def read(self, req: PullRequest, consumer: Callable[[PullReply], Any],
             timeout: float | None = None, cancelled: Cancelled = never) -> Any:
        """Calls ``consumer(reply)`` with the lock held, once readable.

        On the update path the policy decides whether a worker about to start
        ``req.clock`` may read now; on the gradient path ``min_state_step``
        waits for a state snapshot at least that recent. The reply's values
        are the live arrays: the consumer must copy what it keeps (encoding does).
        """
        worker = req.worker
        with self._cond:
            self._require_initialized()
            if worker >= 0:
                self.members.check_member(worker)
            keys = self._read_keys(req.keys)
            if self.policy.exchange.reads_carry_clock:
                self._read_wait(worker, req.clock, timeout, cancelled)
            elif req.min_state_step is not None:
                step = req.min_state_step
                reading_ahead = worker >= 0 and self.state_step < step
                if reading_ahead:  # (see _ctx: a barrier does not wait for this worker meanwhile)
                    self._reading_ahead[worker] = step
                    self._cond.notify_all()
                try:
                    self.waits.wait_for(lambda: Wait(self.state_step < step,
                                                     f"state snapshot of step {step} not written yet"),
                                        timeout, "read the state", cancelled)
                finally:
                    if reading_ahead:
                        self._reading_ahead.pop(worker, None)
            self._touch(worker)
            return self._read_locked(worker, keys, consumer)

    def _read_locked(self, worker: int, keys: list[str], consumer) -> Any:
        values = {k: self.variables.values[k] for k in keys}
        self.stats["pulls"] += 1
        self.stats["bytes_out"] += sum(v.nbytes for v in values.values())
        clock = self.policy.clock_of(worker) if worker >= 0 else None
        return consumer(PullReply(self.version, self.state_step, clock=clock, values=values, **self._clock_info(),
                                  **self._reply_fields(worker)))

    # ------------------------------------------------------------ membership
    def close(self) -> None:
        """Releases every waiting call (they fail with ``UNAVAILABLE``); the store serves nothing after."""
        with self._cond:
            self.waits.close()

    def control(self, req: ControlRequest) -> ControlReply:
        """Engine → PS: ask workers to leave, take that back, set the job's work,
        or report workers ``gone`` (their process ended: stop waiting for them now,
        not after the heart-beat timeout)."""
        with self._cond:
            for ids in (req.drain, req.undrain, req.gone):
                self.members.check_members(ids or ())
            self.members.control(req.drain, req.undrain, req.gone, req.total_batches)
            self._cond.notify_all()
            return ControlReply(tuple(sorted(self.members.draining)), self.progress, self.job_done,
                                self.members.total_batches)

    def set_excluded(self, worker: int, excluded: Iterable[int]) -> list[int]:
        """Replaces the set of detected stragglers barriers do not wait for."""
        with self._cond:
            self.members.check_member(worker)
            new = set(excluded)
            self.members.check_members(new)
            self._touch(worker)
            self.stats["set_excluded"] += 1
            if new != self.members.excluded:
                logger.info("stragglers excluded from barriers: %s (reported by worker %d)", sorted(new), worker)
            self.members.set_excluded(new)
            self._cond.notify_all()
            return sorted(new)

    def heartbeat(self, worker: int) -> list[int]:
        with self._cond:
            self.members.check_member(worker)
            self._touch(worker)
            self._cond.notify_all()
            return sorted(self.members.live())

    def mark_done(self, worker: int) -> set[int]:
        """A worker of the job finished: barriers stop waiting for it. Returns the done set."""
        with self._cond:
            self.members.check_member(worker)
            self.members.mark_done(worker)
            self._cond.notify_all()
            return set(self.members.done_workers)

    def leave(self, worker: int) -> list[int]:
        """A worker stops counting for barriers now (not towards the task's exit); returns the live set.

        Its next training request (a push, a gradient, a state upload, a
        heart-beat) brings it back as a joiner.
        """
        with self._cond:
            self.members.check_member(worker)
            self.members.leave(worker)
            self._cond.notify_all()
            return sorted(self.members.live())

    def check_member(self, worker: int) -> None:
        """Raises :class:`StoreError` unless ``worker`` is a worker of the job."""
        with self._cond:
            self.members.check_member(worker)

    def check_path(self, worker: int, path: str) -> None:
        """Raises unless ``worker`` is the job's and the job is on ``path`` (or its policy is not known yet)."""
        with self._cond:
            self.members.check_member(worker)
            if self.policy is not None:
                self._require_path(path)

    def live_workers(self) -> list[int]:
        with self._cond:
            return sorted(self.members.live())

    # ------------------------------------------------------------ the schema's views
    def state(self) -> dict[str, Any]:
        """Everything the store holds, copied (what a refused request must leave unchanged)."""
        with self._cond:
            return _shard_state.state(self)

    def status(self, brief: bool = False) -> dict[str, Any]:
        """Counters, membership and policy of this PS.

        Args:
            brief: Leave out ``specs`` (one entry per variable), for pollers
                that read only the counters, like the elastic engine.
                Defaults to ``False``.
        """
        with self._cond:
            return _shard_state.status(self, brief)

    # ------------------------------------------------------------ checkpoints
    def checkpoint_step(self) -> int:
        """The shard's position: the state snapshot's step (gradient path) or the batches applied (update path)."""
        with self._cond:
            return self._checkpoint_step()

    def _checkpoint_step(self) -> int:
        return self.state_step if self.policy is not None and self.policy.exchange.steps_are_global else self.progress

    def _maybe_capture(self, previous_step: int) -> None:
        """Captures a checkpoint snapshot when the step crossed a multiple of ``checkpoint_every_steps`` (lock held).

        On the gradient path every PS task sees the same state steps, so the
        snapshots of all tasks at one multiple form a consistent cut.
        """
        step = self._checkpoint_step()
        k = self.checkpoint_every_steps
        if (k and step // k > previous_step // k) or step in self._capture_at:
            self._captured.append(_shard_state.capture(self))
        self._capture_at = {s for s in self._capture_at if s > step}

    @property
    def capture_pending(self) -> bool:
        """Whether a snapshot is scheduled (``capture_at``) or captured and not yet taken."""
        return bool(self._capture_at or self._captured)

    def take_captured(self) -> list[tuple[int, dict[str, Any], dict[str, np.ndarray]]]:
        """The snapshots :meth:`_maybe_capture` took since the last call, oldest first."""
        with self._cond:
            captured, self._captured = self._captured, []
            return captured

    def checkpoint_state(self) -> tuple[int, dict[str, Any], dict[str, np.ndarray]] | None:
        """``(step, meta, values)`` to write as a checkpoint (copies, taken under the lock); ``None`` before init.

        Kept: what the components' schemas mark as checkpointed (values,
        specs, versions, steps, the policy and its state, membership, the
        job's batch counters, tables). Not kept: a gradient-path step in
        progress (its gradients are sent again) and liveness times (a
        restored task gives every worker a fresh start-up grace).
        """
        with self._cond:
            if not self.initialized:
                return None
            return _shard_state.capture(self)

    def restore(self, meta: Mapping[str, Any], values: Mapping[str, np.ndarray], replace: bool = False) -> None:
        """Loads a checkpoint written from :meth:`checkpoint_state`, all or nothing.

        Args:
            replace: Roll an initialised store back (the gradient path's
                recovery); it takes a new incarnation. Defaults to ``False``:
                only a store that holds no values yet may restore.

        Raises:
            StoreError: ``DATA_LOSS`` when the checkpoint is malformed (any
                field, value or table; checked whole before anything is
                assigned), ``FAILED_PRECONDITION`` when it does not fit this
                store (it already holds values, another job's worker count or
                variables); nothing is changed then.
        """
        _shard_state.restore(self, meta, values, replace)
