"""The parameter store of one PS task: values, validation, policy and liveness.

No sockets here: the gRPC server (``tfdist.ps.server``) parses every request
into a typed request of :mod:`tfdist.ps.protocol` and calls these methods,
which makes the store testable in-process. Every method checks the whole
request against the store's state first (initialised, a worker of the job,
known variables, dtypes and shapes, finite values, the exchange path) and
only then changes anything, under one lock: a refused request leaves the
store exactly as it was (values, versions, clocks, membership, the done set,
counters). Refusals raise :class:`StoreError`.

Two exchange paths (see :mod:`tfdist.consistency.base`):

* update path — :meth:`push` adds deltas, :meth:`read` serves values once
  the policy lets the reader start its clock, :meth:`push_pull` does both in
  one call for policies whose reads never wait (ASP);
* gradient path — :meth:`push_gradients` accumulates gradients for the
  current global step, completes the step when the policy says so, and
  answers every contributor (and late, dropped ones) with the step's
  aggregate; :meth:`put_state` / :meth:`read` keep the canonical state
  snapshot (weights, optimizer slots, counters) for workers that resync.

Waits are bounded: by the caller's budget, by ``max_wait_s`` (the job's RPC
timeout), by the caller going away (``cancelled``) and by :meth:`close`. At
most ``max_waiters`` calls wait at once (gradient contributors, at most one
per worker, are not counted); more are refused at once with
``RESOURCE_EXHAUSTED``, so stuck callers never take every server thread.

Membership: a worker is live while it heart-beats within the timeout and has
not said it is done. Workers the job expects but that have not appeared yet
count as live (clock 0) for ``startup_grace_s`` after initialisation, so the
first steps wait for a slow starter instead of racing ahead. Only workers of
the job (ids ``0 .. num_workers - 1``) are heard.
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
import time
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from tfdist import constants
from tfdist.consistency import policy_from_spec
from tfdist.consistency.base import ConsistencyPolicy, GradientAction, PolicyContext, PushAction
from tfdist.ps.placement import VariableSpec
from tfdist.ps.sparse import Table
from tfdist.ps.protocol import _table_shard  # noqa: F401  (checkpoints reuse the wire check)
from tfdist.ps.protocol import (
    ControlRequest,
    InitRequest,
    LookupRequest,
    PushRowsRequest,
    WriteRowsRequest,
    TableShard,
    PullRequest,
    PushGradientsRequest,
    PushPullRequest,
    PushRequest,
    PutStateRequest,
    RequestError,
    WaitInitRequest,
    short,
)

__all__ = ["ParameterStore", "StoreError", "all_finite"]

logger = logging.getLogger(__name__)

#: Completed steps whose aggregates are kept for workers that arrive late.
AGGREGATE_HISTORY = 8

#: gRPC status of a consistency-policy wait that ran out of time (the PS itself is fine).
WAIT_TIMEOUT_CODE = "ABORTED"

Cancelled = Callable[[], bool]


def _never() -> bool:
    return False


class StoreError(RequestError):
    """A request the store refuses; ``grpc_code`` names the gRPC status. Nothing was changed."""


def all_finite(value: np.ndarray) -> bool:
    """Whether every element of ``value`` is finite (integers always are).

    A float sum is finite only if every element is (NaN and Inf propagate),
    so one reduction decides the usual case; only a sum that overflowed
    needs the element-wise check.
    """
    if value.dtype.kind in "iub" or value.size == 0:
        return True
    if value.dtype.kind != "f":  # bfloat16 (ml_dtypes)
        value = value.astype(np.float32)
    with np.errstate(all="ignore"):
        if math.isfinite(float(np.add.reduce(value, axis=None))):
            return True
    return bool(np.isfinite(value).all())


class ParameterStore:
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

    Elastic membership: a worker is *live* while it heart-beats; a worker
    heard from for the first time (or again after it left) is announced to
    the policy (``on_join``); a worker leaves by ``Done`` (graceful) or by
    silence (crash). :meth:`control` marks workers to *drain* (their replies
    say ``leave``) and sets the job's total work (replies say ``job_done``
    once that many batches are applied).
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
    ):
        self.policy = policy
        self.max_updates_per_s = max_updates_per_s
        self._next_slot = 0.0
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.startup_grace_s = startup_grace_s
        self.num_workers = num_workers
        self.max_wait_s = max_wait_s
        self.max_waiters = max_waiters if max_waiters is not None else (num_workers or 12) + 4
        self._waiters = 0
        self._closing = False
        self._time = time_fn
        self._cond = threading.Condition()
        self._values: dict[str, np.ndarray] = {}
        self._specs: dict[str, VariableSpec] = {}
        #: PS-resident tables (this task's shard of each), by key.
        self._tables: dict[str, Table] = {}
        #: Gradient path: each worker's row gradients for the current step (applied when it completes).
        self._sparse_acc: dict[int, list[tuple[str, np.ndarray, np.ndarray, float | None]]] = {}
        self.nonfinite = "refuse"
        self.version = 0
        self.initialized_by: int | None = None
        self._init_time = 0.0
        self._expected: set[int] = set()
        self._last_seen: dict[int, float] = {}
        self._ever_seen: set[int] = set()
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
        # gradient path
        self.global_step = 0
        self._acc: dict[str, np.ndarray] = {}
        self._contributors: set[int] = set()
        self._history: dict[int, tuple[dict[str, np.ndarray], int]] = {}  # step -> (aggregate, closer)
        self.state_step = 0
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
        self.stats = {
            "pushes": 0, "pulls": 0, "dropped": 0, "bytes_in": 0, "bytes_out": 0,
            "waits": 0, "aggregations": 0, "gradients_aggregated": 0, "state_writes": 0, "row_pushes": 0,
            "row_writes": 0, "set_excluded": 0,
        }

    # ---------------------------------------------------------------- init
    @property
    def initialized(self) -> bool:
        return self.initialized_by is not None

    def init(self, req: InitRequest) -> dict[str, Any]:
        """Stores the initial values, policy and non-finite policy unless already initialised.

        Returns:
            ``initialized_here`` True if this call initialised the store;
            False if it already was (the caller should then pull). Specs and
            policy are checked either way.
        """
        self._check_finite(req.values, req.worker, "initial value", req.nonfinite)
        with self._cond:
            self._check_member(req.worker, req.num_workers)
            if self.initialized and req.reset:
                return self._reset(req)
            if self.initialized:
                self._check_same_specs(req.specs)
                self._check_same_tables(req.tables)
                self._check_same_policy(req.policy)
                self.done_workers.discard(req.worker)
                self._touch(req.worker)
                return {"initialized_here": False, "version": self.version, "global_step": self.global_step,
                        "incarnation": self.incarnation, "state_step": self.state_step}
            policy = self.policy
            if req.policy is not None:
                policy = policy_from_spec(req.policy, req.num_workers or 1)  # parse validated the spec
            if policy is None:
                raise StoreError("No consistency policy: the initialising worker must send one.")
            tables = {t.spec.key: Table(t.spec, t.shard, t.num_shards) for t in req.tables}  # allocates the rows
            # -- every check passed: apply
            self._tables = tables
            self.policy = policy
            if self.num_workers is None and req.num_workers is not None:
                self.num_workers = req.num_workers
            self.nonfinite = req.nonfinite
            self._specs = {s.key: s for s in req.specs}
            self._values = {s.key: np.array(req.values[s.key], copy=True) for s in req.specs}
            self.version = 1
            self.global_step = self.state_step = req.step
            self.initialized_by = req.worker
            self._init_time = self._time()
            self._expected = set(range(req.num_workers or 0))
            self.done_workers.discard(req.worker)
            self._touch(req.worker)
            self.policy.on_step_boundary(self._ctx())
            self._cond.notify_all()
        total = sum(s.nbytes for s in req.specs)
        logger.info("initialised by worker %d: %d variables, %d bytes, policy %s, non-finite values: %s",
                    req.worker, len(req.specs), total, self.policy.spec(), self.nonfinite)
        return {"initialized_here": True, "version": self.version, "global_step": self.global_step,
                "incarnation": self.incarnation, "state_step": self.state_step}

    def _reset(self, req: InitRequest) -> dict[str, Any]:
        """The chief replaces the values of an initialised store and restarts its step (lock held)."""
        if req.worker != 0:
            raise StoreError(f"Only the chief (worker 0) may reset a parameter server; worker {req.worker} asked.",
                             grpc_code="PERMISSION_DENIED")
        self._check_same_specs(req.specs)
        self._check_same_tables(req.tables)
        self._check_same_policy(req.policy)
        # -- every check passed: apply (the tables stay: no worker holds their rows)
        for key, value in req.values.items():
            np.copyto(self._values[key], value)
        self.version += 1
        self._restart_step(req.step)
        self.incarnation = secrets.randbits(48)
        self._touch(req.worker)
        self._cond.notify_all()
        logger.warning("reset by worker %d to its values at step %d (incarnation %d)", req.worker, req.step,
                       self.incarnation)
        return {"initialized_here": True, "version": self.version, "global_step": self.global_step,
                "incarnation": self.incarnation, "state_step": self.state_step}

    def _restart_step(self, step: int) -> None:
        """The gradient path starts again at ``step``: no step in progress, no aggregates kept (lock held)."""
        self.global_step = self.state_step = step
        self._acc, self._contributors, self._history = {}, set(), {}
        self._sparse_acc = {}
        if self.policy is not None:
            self.policy.on_step_boundary(self._ctx())

    def wait_init(self, req: WaitInitRequest, timeout: float | None = None, cancelled: Cancelled = _never
                  ) -> dict[str, Any]:
        """Waits (bounded) until initialised; then checks the caller's specs/policy and re-admits it."""
        with self._cond:
            if req.worker is not None:
                self._check_member(req.worker, req.num_workers)
            if not self.initialized:
                budget = req.timeout_s if timeout is None else min(req.timeout_s, timeout)
                try:
                    self._wait_for(lambda: _Wait(not self.initialized, "not initialised yet"), budget,
                                   "initialise", cancelled)
                except StoreError as e:
                    if e.grpc_code != WAIT_TIMEOUT_CODE:
                        raise
                    return {"initialized": False, "version": self.version, "global_step": self.global_step,
                            "incarnation": self.incarnation}
            if req.specs is not None:
                self._check_same_specs(req.specs)
            self._check_same_policy(req.policy)
            if req.worker is not None:  # a worker (re)starts a session: it may come back after it said Done
                self.done_workers.discard(req.worker)
                self.draining.discard(req.worker)
            return {"initialized": True, "version": self.version, "global_step": self.global_step,
                    "incarnation": self.incarnation, "state_step": self.state_step}

    def specs(self) -> list[VariableSpec]:
        with self._cond:
            return list(self._specs.values())

    def _check_same_specs(self, specs: Iterable[VariableSpec]) -> None:
        theirs = {s.key: s for s in specs}
        if theirs != self._specs:
            diff = sorted(
                (k, f"{s.dtype}{list(s.shape)}") for k, s in set(theirs.items()) ^ set(self._specs.items())
            )[:4]
            raise StoreError(
                "This worker's variables differ from the ones the parameter servers "
                f"were initialised with (first differences: {short(diff, 300)}). Every worker must "
                "build the same model, creating variables in the same order.",
                grpc_code="FAILED_PRECONDITION",
            )

    def _check_same_tables(self, tables: Iterable[TableShard]) -> None:
        theirs = {t.spec.key: (t.spec, t.shard, t.num_shards) for t in tables}
        mine = {k: (t.spec, t.shard, t.num_shards) for k, t in self._tables.items()}
        if theirs != mine:
            diff = sorted(set(theirs) ^ set(mine)) or sorted(k for k in theirs if theirs[k] != mine.get(k))
            raise StoreError(
                f"This worker's PS-resident tables differ from the ones the parameter servers hold (first "
                f"differences: {short(diff[:4], 300)}). Every worker must build the same model.",
                grpc_code="FAILED_PRECONDITION")

    def _check_same_policy(self, spec: dict | None) -> None:
        if spec is not None and self.policy is not None and spec != self.policy.spec():
            raise StoreError(
                f"This worker uses consistency {spec}, but the job runs {self.policy.spec()} "
                "(chosen by the chief). Use the same strategy settings on every worker.",
                grpc_code="FAILED_PRECONDITION",
            )

    # ------------------------------------------------------------ validation
    def _check_member(self, worker: int, claimed_num_workers: int | None = None) -> None:
        n = self.num_workers if self.num_workers is not None else claimed_num_workers
        if worker < 0 or (n is not None and worker >= n):
            raise StoreError(
                f"Worker {worker} is not a worker of this job (its workers are 0..{(n or 1) - 1}). "
                "Check the task's worker id and the cluster config every task uses.",
                grpc_code="PERMISSION_DENIED",
            )

    def _require_initialized(self) -> None:
        if not self.initialized:
            # UNAVAILABLE (retry later), not a refusal: workers only ever see it from a task that
            # restarted without a checkpoint, and recover by waiting for the chief to initialise it.
            raise StoreError(
                "The parameter server has no variables yet: the chief (or worker 0) "
                "initialises them at its first step.",
                grpc_code="UNAVAILABLE",
            )

    def _check_keys(self, keys: Iterable[str]) -> None:
        unknown = [k for k in keys if k not in self._values]
        if unknown:
            known = list(self._values)[:4]
            raise StoreError(
                f"Unknown variable(s) {short(unknown[:4], 200)} on this parameter server. "
                f"It holds {len(self._values)} variables, e.g. {short(known, 200)}.",
                grpc_code="NOT_FOUND",
            )

    def _check_tensors(self, tensors: Mapping[str, np.ndarray], trainable_only: bool = False) -> None:
        self._check_keys(tensors)
        for key, value in tensors.items():
            spec = self._specs[key]
            if trainable_only and not spec.trainable:
                raise StoreError(f"{short(key)} is not trainable: gradients cannot be pushed for it.")
            if value.dtype.name != spec.dtype:
                raise StoreError(
                    f"Wrong dtype for {short(key)}: received {value.dtype.name}, the variable is {spec.dtype}."
                )
            if tuple(value.shape) != tuple(spec.shape):
                raise StoreError(
                    f"Wrong shape for {short(key)}: received {list(value.shape)}, the variable is {list(spec.shape)}."
                )

    def _check_finite(self, tensors: Mapping[str, np.ndarray], worker: int, what: str,
                      policy: str | None = None) -> None:
        """Refuses NaN/Inf unless the job allows them (checked before the lock: it reads only the arrays)."""
        if (policy or self.nonfinite) == "allow":
            return
        for key, value in tensors.items():
            if not all_finite(value):
                raise StoreError(
                    f"Non-finite {what} (NaN or Inf) for {short(key)} from worker {worker}: refused, so it cannot "
                    "poison the other workers. The worker's training has diverged (lower the learning rate, "
                    "clip gradients), or set ps.nonfinite: allow to store such values.",
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

    def _check_push(self, req: PushRequest) -> None:
        self._require_initialized()
        self._check_incarnation(req.incarnation)
        self._check_member(req.worker)
        self._require_path("update")
        self._check_tensors({k: v for k, v in req.deltas.items() if k not in req.rows})
        self._check_keys(req.rows)
        for key, rows in req.rows.items():
            spec, value = self._specs[key], req.deltas[key]
            if value.dtype.name != spec.dtype or len(spec.shape) < 1 or tuple(value.shape[1:]) != tuple(spec.shape[1:]):
                raise StoreError(f"Wrong rows for {short(key)}: received {value.dtype.name}{list(value.shape)}, the "
                                 f"variable is {spec.dtype}{list(spec.shape)}.")
            if rows.size and (int(rows.min()) < 0 or int(rows.max()) >= spec.shape[0]):
                raise StoreError(f"Rows of {short(key)} outside 0..{spec.shape[0] - 1}.", grpc_code="OUT_OF_RANGE")

    # ----------------------------------------------------------- update path
    def push(self, req: PushRequest, timeout: float | None = None, cancelled: Cancelled = _never) -> dict[str, Any]:
        """Adds the deltas to the stored values, as the policy decides.

        ``req.clock`` is the number of steps the worker has completed with
        this push; ``req.steps`` how many local steps (batches) the deltas sum
        (``strategy.exchange_every``); the job's batch counters advance by it.
        """
        self._check_finite(req.deltas, req.worker, "update")
        with self._cond:
            self._check_push(req)
            return self._apply_push(req, timeout, cancelled)

    def push_pull(self, req: PushPullRequest, consumer: Callable[[dict, dict, bool], Any],
                  timeout: float | None = None, cancelled: Cancelled = _never) -> Any:
        """A push and a read in one call, for policies whose reads never wait (ASP).

        Calls ``consumer(meta, values, unchanged)`` under the lock after the
        push; ``unchanged`` is True when the push landed right on
        ``req.base_version`` and nothing landed after it (the caller then
        knows the values: its snapshot plus its delta).
        """
        push = req.push
        self._check_finite(push.deltas, push.worker, "update")
        with self._cond:
            self._check_push(push)
            keys = self._read_keys(req.keys)
            if self.policy.read_may_wait():
                raise StoreError(
                    f"PushPull is for jobs whose reads never wait; this job runs {self.policy.spec()}. "
                    "Send Push, then Pull.", grpc_code="FAILED_PRECONDITION",
                )
            result = self._apply_push(push, timeout, cancelled)
            unchanged = (req.base_version is not None and result["applied"]
                         and result["previous_version"] == req.base_version)
            return self._read_locked(push.worker, keys, lambda meta, values: consumer(
                {**meta, "push": result}, values, unchanged))

    def _apply_push(self, req: PushRequest, timeout: float | None, cancelled: Cancelled) -> dict[str, Any]:
        """Applies a checked push (lock held); waits only before changing anything."""
        worker = req.worker
        self._admit(timeout, cancelled)
        decision = self._wait_for(lambda: self.policy.on_push(worker, req.clock, self._ctx()), timeout, "push",
                                  cancelled)
        self._touch(worker)
        self._count_batch(worker, req.steps)
        if decision.action is PushAction.DROP:
            self.stats["dropped"] += 1
            return {"applied": False, "dropped": True, "version": self.version, "reason": decision.reason,
                    **self._member_info(worker)}
        for key, delta in req.deltas.items():
            rows = req.rows.get(key)
            if rows is None:
                self._values[key] += delta
            else:
                self._values[key][rows] += delta  # distinct rows (checked when parsed)
                self.stats["bytes_in"] += rows.nbytes
            self.stats["bytes_in"] += delta.nbytes
        previous = self.version
        self.version += 1
        self.stats["pushes"] += 1
        self.progress += req.steps
        self.policy.on_applied(worker, req.clock, self._ctx(), req.loss)
        self._maybe_capture(self.progress - req.steps)
        self._cond.notify_all()
        return {"applied": True, "dropped": False, "version": self.version, "previous_version": previous,
                **self._clock_info(), **self._member_info(worker)}

    def _clock_info(self) -> dict[str, Any]:
        return {"global_step": self.global_step, **self.policy.clock_fields(self._ctx())}

    def _read_keys(self, keys: Iterable[str] | None) -> list[str]:
        if keys is None:
            return list(self._values)
        self._check_keys(keys)
        return list(keys)

    def read(self, req: PullRequest, consumer: Callable[[dict[str, Any], dict[str, np.ndarray]], Any],
             timeout: float | None = None, cancelled: Cancelled = _never) -> Any:
        """Calls ``consumer(meta, values)`` with the lock held, once readable.

        On the update path the policy decides whether a worker about to start
        ``req.clock`` may read now; on the gradient path ``min_state_step``
        waits for a state snapshot at least that recent. ``values`` are the
        live arrays: the consumer must copy what it keeps (encoding does).
        """
        worker = req.worker
        with self._cond:
            self._require_initialized()
            if worker >= 0:
                self._check_member(worker)
            keys = self._read_keys(req.keys)
            if self.policy.path == "update":
                self._read_wait(worker, req.clock, timeout, cancelled)
            elif req.min_state_step is not None:
                step = req.min_state_step
                self._wait_for(lambda: _Wait(self.state_step < step,
                                             f"state snapshot of step {step} not written yet"),
                               timeout, "read the state", cancelled)
            self._touch(worker)
            return self._read_locked(worker, keys, consumer)

    def _read_locked(self, worker: int, keys: list[str], consumer) -> Any:
        values = {k: self._values[k] for k in keys}
        self.stats["pulls"] += 1
        self.stats["bytes_out"] += sum(v.nbytes for v in values.values())
        meta = {"version": self.version, "state_step": self.state_step, **self._clock_info(),
                **self._member_info(worker)}
        if worker >= 0:
            clock = self.policy.clock_of(worker)
            if clock is not None:
                meta["clock"] = clock
        return consumer(meta, values)

    def _read_wait(self, worker: int, clock: int, timeout: float | None, cancelled: Cancelled) -> None:
        """Update path: tells the policy the reader's clock (``on_read``), then waits as it says (lock held).

        A read that is refused (its wait ran out, the caller went away) leaves
        the policy's state as it was.
        """
        saved = None
        if worker >= 0:
            known = self.policy.clock_of(worker)
            if known is not None and clock > known:
                saved = self.policy.state()
                self.policy.on_read(worker, clock)
        try:
            self._wait_for(lambda: self._pull_decision(worker, clock), timeout, "pull", cancelled)
        except StoreError:
            if saved is not None:
                self.policy.restore(saved)
            raise

    def _pull_decision(self, worker: int, clock: int):
        decision = self.policy.on_pull(worker, clock, self._ctx())
        return _Wait(decision.wait, decision.reason)

    # --------------------------------------------------------- gradient path
    def push_gradients(self, req: PushGradientsRequest, timeout: float | None = None,
                       cancelled: Cancelled = _never) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """Contributes gradients to global step ``req.step``; returns that step's aggregate.

        Blocks (bounded) until the step is complete. A gradient for a step
        that is already complete is dropped; its sender still gets the
        step's aggregate if it is in the recent history, otherwise
        ``resync=True`` (it must reload the state snapshot). A gradient for a
        future step, or a second one from the same worker, is refused.

        Returns:
            ``(meta, aggregate)``; ``meta`` has ``dropped``, ``resync``,
            ``global_step``, ``waited`` (the step was not complete when this
            gradient arrived: the worker waited for others), ``write_state``
            (this worker completed the step and should upload the state after
            applying it).
        """
        worker, step = req.worker, req.step
        self._check_finite(req.grads, worker, "gradient")
        with self._cond:
            self._require_initialized()
            self._check_incarnation(req.incarnation)
            self._check_member(worker)
            self._require_path("gradient")
            self._check_tensors(req.grads, trainable_only=True)
            self._admit(timeout, cancelled)
            decision = self.policy.on_gradient(worker, step, self.global_step, frozenset(self._contributors),
                                               self._ctx())
            if decision.action in (GradientAction.FUTURE, GradientAction.DUPLICATE):
                raise StoreError(f"Gradient refused: {decision.reason}.", grpc_code="FAILED_PRECONDITION")
            self._touch(worker)
            dropped = decision.action is GradientAction.STALE
            waited = False
            self._count_batch(worker)
            if dropped:
                self.stats["dropped"] += 1
            else:
                for key, g in req.grads.items():
                    if key in self._acc:
                        self._acc[key] += g
                    else:
                        self._acc[key] = np.array(g, copy=True)
                    self.stats["bytes_in"] += g.nbytes
                self._contributors.add(worker)
                self._maybe_complete(worker)
                waited = self.global_step <= step
                if waited:
                    self.stats["waits"] += 1
                # A contributor's wait is not counted against max_waiters: at most one per worker.
                # If it runs out, the gradient still counts towards the step (the error says so).
                self._wait_for(lambda: self._step_wait(step), timeout,
                               f"complete step {step} (this worker's gradient is counted)", cancelled,
                               counted=False)
            meta = {"dropped": dropped, "global_step": self.global_step, "step": step, "reason": decision.reason,
                    "waited": not dropped and waited, **self._member_info(worker)}
            if step not in self._history:
                return {**meta, "resync": True, "write_state": False}, {}
            aggregate, closer = self._history[step]
            self.stats["bytes_out"] += sum(a.nbytes for a in aggregate.values())
            return {**meta, "resync": False, "write_state": closer == worker and not dropped}, aggregate

    def _step_wait(self, step: int):
        if self.global_step > step:
            return _Wait(False, "")
        self._maybe_complete(None)  # the live set may have shrunk
        missing = sorted(self._live() - self.excluded - self._contributors)
        return _Wait(self.global_step <= step,
                     f"step {step} has {len(self._contributors)} gradient(s) (from workers "
                     f"{sorted(self._contributors)}); the policy waits for more (live workers not yet heard "
                     f"for this step: {missing})")

    def _maybe_complete(self, closer: int | None) -> None:
        contributors = frozenset(self._contributors)
        if not contributors or not self.policy.step_complete(contributors, self._ctx()):
            return
        m = self.policy.aggregation_size()
        if len(contributors) != m:  # Keras scaled every loss by 1/m: make the sum the mean
            for value in self._acc.values():
                value *= np.asarray(m / len(contributors), dtype=value.dtype)
        step = self.global_step
        self._history[step] = (self._acc, closer if closer is not None else min(contributors))
        for old in [s for s in self._history if s <= step - AGGREGATE_HISTORY]:
            del self._history[old]
        self._apply_sparse_step(contributors, m)
        self.stats["aggregations"] += 1
        self.stats["gradients_aggregated"] += len(contributors)
        self.progress += len(contributors)
        self._acc, self._contributors = {}, set()
        self.global_step = step + 1
        self.policy.on_step_boundary(self._ctx())
        self._cond.notify_all()

    # ------------------------------------------------------------ tables
    def _table(self, key: str) -> Table:
        table = self._tables.get(key)
        if table is None:
            raise StoreError(f"Unknown table {short(key)} on this parameter server. It holds "
                             f"{len(self._tables)} table(s), e.g. {short(list(self._tables)[:4], 200)}.",
                             grpc_code="NOT_FOUND")
        return table

    @staticmethod
    def _check_rows(table: Table, rows: np.ndarray) -> None:
        if rows.size and (int(rows.min()) < 0 or int(rows.max()) >= table.num_rows):
            bad = rows[(rows < 0) | (rows >= table.num_rows)][:4].tolist()
            raise StoreError(f"Rows {bad} are outside {short(table.spec.key)}'s shard {table.shard} of "
                             f"{table.num_shards} ({table.num_rows} rows: 0..{table.num_rows - 1}).",
                             grpc_code="OUT_OF_RANGE")

    def lookup(self, req: LookupRequest, consumer: Callable[[dict[str, Any], dict[str, np.ndarray]], Any],
               timeout: float | None = None, cancelled: Cancelled = _never) -> Any:
        """Calls ``consumer(meta, {"values": rows, ...})`` once the rows may be read (update path: SSP's rule).

        Every table the request names (``key`` and ``also``) is checked before any is read.
        """
        with self._cond:
            self._require_initialized()
            if req.worker >= 0:
                self._check_member(req.worker)
            tables = [self._table(key) for key in (req.key, *req.also)]
            for table in tables:
                self._check_rows(table, req.rows)
            if self.policy.path == "update" and req.worker >= 0 and req.clock is not None:
                self._read_wait(req.worker, req.clock, timeout, cancelled)
            self._touch(req.worker)
            values = {LookupRequest.values_name(i): table.lookup(req.rows) for i, table in enumerate(tables)}
            self.stats["pulls"] += 1
            self.stats["bytes_out"] += sum(v.nbytes for v in values.values())
            return consumer({"version": self.version, "incarnation": self.incarnation}, values)

    def push_rows(self, req: PushRowsRequest) -> dict[str, Any]:
        """Row gradients (of every table the request names): applied now (update path) or counted towards
        ``req.step`` (gradient path). Every table's part is checked before any is applied."""
        parts = req.tables()
        for key, grads in parts:
            self._check_row_array(req, grads, "Row gradients of", "row gradient", key)
        with self._cond:
            tables = [self._row_request_table(req, grads, "Row gradients of", key) for key, grads in parts]
            if self.policy.path == "gradient":
                if req.step is None:
                    raise StoreError("PushRows on the gradient path names the global step (`step`).")
                if req.step > self.global_step:
                    raise StoreError(f"Row gradients for step {req.step} refused: the job is at step "
                                     f"{self.global_step}.", grpc_code="FAILED_PRECONDITION")
                self._touch(req.worker)
                if req.step < self.global_step:  # that step is over: dropped, like a stale dense gradient
                    self.stats["dropped"] += 1
                    return {"applied": False, "dropped": True}
                for key, grads in parts:
                    self._sparse_acc.setdefault(req.worker, []).append(
                        (key, np.array(req.rows, copy=True), np.array(grads, copy=True), req.learning_rate))
                return {"applied": False, "dropped": False}
            self._touch(req.worker)
            for table, (_, grads) in zip(tables, parts):
                table.apply(req.rows, grads, req.learning_rate)
            self.stats["bytes_in"] += sum(g.nbytes for _, g in parts) + req.rows.nbytes
            self.stats["row_pushes"] += len(parts)
            return {"applied": True, "dropped": False}

    def _check_row_array(self, req, array: np.ndarray, what: str, finite_what: str, key: str | None = None) -> None:
        """A row request's array (before the lock: it reads only the array): float32, finite per policy."""
        key = req.key if key is None else key
        if array.dtype != np.float32:
            raise StoreError(f"{what} {short(key)} must be float32. Received: {array.dtype.name}.")
        self._check_finite({key: array}, req.worker, finite_what)

    def _row_request_table(self, req, array: np.ndarray, what: str, key: str | None = None) -> Table:
        """The table (``key``, default the request's) a row request names, once the request fits it (lock held)."""
        key = req.key if key is None else key
        self._require_initialized()
        self._check_incarnation(req.incarnation)
        self._check_member(req.worker)
        table = self._table(key)
        if array.shape[1] != table.spec.dim:
            raise StoreError(f"{what} {short(key)} are {array.shape[1]} wide; its rows are {table.spec.dim}.")
        self._check_rows(table, req.rows)
        return table

    def write_rows(self, req: WriteRowsRequest) -> dict[str, Any]:
        """Sets rows of a table (a worker loading weights into it), all or nothing."""
        self._check_row_array(req, req.values, "Rows written to", "row value")
        with self._cond:
            table = self._row_request_table(req, req.values, "Rows written to")
            self._touch(req.worker)
            table.write(req.rows, req.values)
            self.stats["bytes_in"] += req.values.nbytes + req.rows.nbytes
            self.stats["row_writes"] += 1
            return {"written": int(len(req.rows))}

    def _apply_sparse_step(self, contributors: frozenset[int], m: int) -> None:
        """Gradient path, a step completes: each table gets its contributors' row gradients summed (lock held)."""
        pending, self._sparse_acc = self._sparse_acc, {}
        by_key: dict[str, tuple[list, list, float | None]] = {}
        for worker in sorted(contributors):
            for key, rows, grads, lr in pending.get(worker, ()):
                entry = by_key.setdefault(key, ([], [], lr))
                entry[0].append(rows)
                entry[1].append(grads)
        scale = np.float32(m / len(contributors)) if contributors and len(contributors) != m else None
        for key, (rows, grads, lr) in by_key.items():
            g = np.concatenate(grads)
            if scale is not None:
                g *= scale
            self._tables[key].apply(np.concatenate(rows), g, lr)

    def table_arrays(self) -> dict[str, np.ndarray]:
        """Every table's values and slots, keyed ``table/<key>/<array>`` (copies: checkpoints, status)."""
        with self._cond:
            return self._table_arrays_locked()

    def _table_arrays_locked(self) -> dict[str, np.ndarray]:
        return {f"table/{key}/{name}": a.copy() for key, t in self._tables.items() for name, a in t.arrays().items()}

    def put_state(self, req: PutStateRequest) -> dict[str, Any]:
        """Replaces the state snapshot with the one a worker had after ``req.step`` steps.

        Older snapshots than the stored one are ignored (``stored: False``).
        """
        self._check_finite(req.tensors, req.worker, "state value")
        with self._cond:
            self._require_initialized()
            self._check_incarnation(req.incarnation)
            self._check_member(req.worker)
            self._check_tensors(req.tensors)
            self._touch(req.worker)
            if req.step <= self.state_step and self.state_step > 0:
                return {"stored": False, "state_step": self.state_step}
            for key, value in req.tensors.items():
                np.copyto(self._values[key], value)
            previous = self.state_step
            self.state_step = req.step
            self.version += 1
            self.stats["state_writes"] += 1
            self._maybe_capture(previous)
            self._cond.notify_all()
            return {"stored": True, "state_step": self.state_step}

    # ---------------------------------------------------------------- waits
    def _wait_for(self, decide, timeout: float | None, what: str, cancelled: Cancelled = _never,
                  counted: bool = True):
        """Re-asks ``decide`` until it does not say WAIT (lock held), within the bounds.

        Bounds: ``timeout`` and ``max_wait_s`` (→ ``ABORTED``, a policy wait
        that ran out), the caller cancelling (→ ``CANCELLED``), :meth:`close`
        (→ ``UNAVAILABLE``). With ``counted``, a wait takes one of
        ``max_waiters`` places, and is refused (``RESOURCE_EXHAUSTED``) when
        none is free; it must then not have changed anything yet.
        """
        decision = decide()
        if decision.action is not PushAction.WAIT:
            return decision
        if counted and self._waiters >= self.max_waiters:
            raise StoreError(
                f"Too many calls are waiting on this parameter server ({self._waiters}; at most "
                f"{self.max_waiters}): refused instead of queued. Waiting to {what}: {decision.reason}.",
                grpc_code="RESOURCE_EXHAUSTED",
            )
        bound = self.max_wait_s if timeout is None else min(timeout, self.max_wait_s)
        deadline = self._time() + bound
        if counted:
            self._waiters += 1
        try:
            while True:
                if self._closing:
                    raise StoreError("The parameter server is stopping.", grpc_code="UNAVAILABLE")
                if cancelled():
                    raise StoreError(f"The caller went away while waiting to {what}.", grpc_code="CANCELLED")
                remaining = deadline - self._time()
                if remaining <= 0:
                    raise StoreError(
                        f"Timed out after {bound:g} s waiting to {what}: "
                        f"{decision.reason or 'the consistency policy said wait'}. The parameter server is "
                        "healthy; raise ps.rpc_timeout_s if workers are expected to lag this much.",
                        grpc_code=WAIT_TIMEOUT_CODE,
                    )
                # Re-check at least every 0.2 s: liveness changes by the passage of time.
                self._cond.wait(timeout=min(remaining, 0.2))
                decision = decide()
                if decision.action is not PushAction.WAIT:
                    if what == "pull":
                        self.stats["waits"] += 1  # reads that had to wait (counted once they may go on)
                    return decision
        finally:
            if counted:
                self._waiters -= 1

    def close(self) -> None:
        """Releases every waiting call (they fail with ``UNAVAILABLE``); the store serves nothing after."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()

    # ------------------------------------------------------------ capacity
    def _admit(self, timeout: float | None, cancelled: Cancelled = _never) -> None:
        """Waits for this update's slot when ``max_updates_per_s`` caps the rate (lock released while waiting).

        The slot is reserved before the wait, so concurrent callers get consecutive slots.
        """
        if not self.max_updates_per_s:
            return
        slot = max(self._time(), self._next_slot)
        self._next_slot = slot + 1.0 / self.max_updates_per_s
        self._wait_for(lambda: _Wait(self._time() < slot, "a slot of the PS's capacity (ps.max_updates_per_s)"),
                       timeout, "get an update slot", cancelled)

    # ------------------------------------------------------------ membership
    def _count_batch(self, worker: int, steps: int = 1) -> None:
        if worker >= 0:
            self.worker_batches[worker] = self.worker_batches.get(worker, 0) + steps

    def _member_info(self, worker: int) -> dict[str, Any]:
        info: dict[str, Any] = {"incarnation": self.incarnation}
        if worker in self.draining:
            info["leave"] = True
        if self.job_done:
            info["job_done"] = True
        return info

    @property
    def job_done(self) -> bool:
        return self.total_batches is not None and self.progress >= self.total_batches

    def control(self, req: ControlRequest) -> dict[str, Any]:
        """Engine → PS: ask workers to leave, take that back, set the job's work,
        or report workers ``gone`` (their process ended: stop waiting for them now,
        not after the heart-beat timeout)."""
        with self._cond:
            for ids in (req.drain, req.undrain, req.gone):
                for w in sorted(ids or ()):
                    self._check_member(w)
            for w in req.gone or ():
                self.done_workers.add(w)
                self._last_seen.pop(w, None)
                self.draining.discard(w)
            if req.drain:
                self.draining |= req.drain
                logger.info("workers asked to leave: %s", sorted(self.draining))
            if req.undrain:
                self.draining -= req.undrain
            if req.total_batches is not None:
                self.total_batches = req.total_batches
            self._cond.notify_all()
            return {"draining": sorted(self.draining), "total_batches": self.total_batches,
                    "progress": self.progress, "job_done": self.job_done}

    # ------------------------------------------------------------ liveness
    def _touch(self, worker: int) -> None:
        if worker < 0 or worker in self.done_workers:
            return
        self.left_workers.discard(worker)
        now = self._time()
        last = self._last_seen.get(worker)
        # An expected worker's first contact is the job's start (it counted as live at clock 0
        # meanwhile), not a join; anyone else new, or back after leaving, joins the running job.
        joining = worker in self._ever_seen or worker not in self._expected
        self._ever_seen.add(worker)
        if (last is None or now - last > self.heartbeat_timeout_s) and joining and self.policy is not None \
                and self.initialized:
            self.joins += 1
            self._last_seen.pop(worker, None)
            self.policy.on_join(worker, self._ctx())
            logger.info("worker %d joined (live: %s)", worker, sorted(self._live() | {worker}))
        self._last_seen[worker] = now

    def _live(self) -> frozenset[int]:
        now = self._time()
        live = {w for w, t in self._last_seen.items() if now - t <= self.heartbeat_timeout_s}
        if self.initialized and now - self._init_time <= self.startup_grace_s:
            live |= {w for w in self._expected
                     if w not in self._last_seen and w not in self.done_workers and w not in self.left_workers}
        return frozenset(live)

    def _ctx(self) -> PolicyContext:
        live = self._live()
        return PolicyContext(self._time(), live, frozenset(self.excluded & live))

    def set_excluded(self, worker: int, excluded: Iterable[int]) -> list[int]:
        """Replaces the set of detected stragglers barriers do not wait for."""
        with self._cond:
            self._check_member(worker)
            new = set(excluded)
            for w in sorted(new):
                self._check_member(w)
            self._touch(worker)
            self.stats["set_excluded"] += 1
            if new != self.excluded:
                logger.info("stragglers excluded from barriers: %s (reported by worker %d)", sorted(new), worker)
            self.excluded = new
            self._cond.notify_all()
            return sorted(self.excluded)

    def heartbeat(self, worker: int) -> list[int]:
        with self._cond:
            self._check_member(worker)
            self._touch(worker)
            self._cond.notify_all()
            return sorted(self._live())

    def mark_done(self, worker: int) -> set[int]:
        """A worker of the job finished: barriers stop waiting for it. Returns the done set."""
        with self._cond:
            self._check_member(worker)
            self.done_workers.add(worker)
            self._last_seen.pop(worker, None)
            self._cond.notify_all()
            return set(self.done_workers)

    def leave(self, worker: int) -> list[int]:
        """A worker stops counting for barriers now (not towards the task's exit); returns the live set.

        Its next training request (a push, a gradient, a state upload, a
        heart-beat) brings it back as a joiner.
        """
        with self._cond:
            self._check_member(worker)
            self.left_workers.add(worker)
            self._last_seen.pop(worker, None)
            self._cond.notify_all()
            return sorted(self._live())

    def check_member(self, worker: int) -> None:
        """Raises :class:`StoreError` unless ``worker`` is a worker of the job."""
        with self._cond:
            self._check_member(worker)

    def live_workers(self) -> list[int]:
        with self._cond:
            return sorted(self._live())

    def state(self) -> dict[str, Any]:
        """Everything the store holds, copied: values, specs, versions, steps, clocks and policy state,
        membership, counters (what a refused request must leave unchanged, and what a checkpoint holds)."""
        with self._cond:
            return {
                "values": {k: v.copy() for k, v in self._values.items()},
                "specs": [s.to_dict() for s in self._specs.values()],
                "nonfinite": self.nonfinite,
                "num_workers": self.num_workers,
                "version": self.version,
                "initialized_by": self.initialized_by,
                "init_time": self._init_time,
                "expected": sorted(self._expected),
                "global_step": self.global_step,
                "state_step": self.state_step,
                "accumulated": {k: v.copy() for k, v in self._acc.items()},
                "contributors": sorted(self._contributors),
                "history": {step: ({k: v.copy() for k, v in agg.items()}, closer)
                            for step, (agg, closer) in self._history.items()},
                "last_seen": dict(self._last_seen),
                "ever_seen": sorted(self._ever_seen),
                "done_workers": sorted(self.done_workers),
                "left_workers": sorted(self.left_workers),
                "excluded": sorted(self.excluded),
                "draining": sorted(self.draining),
                "total_batches": self.total_batches,
                "worker_batches": dict(self.worker_batches),
                "progress": self.progress,
                "joins": self.joins,
                "stats": dict(self.stats),
                "policy": self.policy.describe() if self.policy else None,
                "policy_state": self.policy.state() if self.policy else None,
                "incarnation": self.incarnation,
                "restored_from": self.restored_from,
                "tables": {**self._table_arrays_locked(),
                           **{f"table/{k}/updates": t.updates for k, t in self._tables.items()}},
                "sparse_pending": {w: [(k, r.copy(), g.copy(), lr) for k, r, g, lr in items]
                                   for w, items in self._sparse_acc.items()},
            }

    # ------------------------------------------------------------ checkpoints
    def checkpoint_step(self) -> int:
        """The shard's position: the state snapshot's step (gradient path) or the batches applied (update path)."""
        with self._cond:
            return self._checkpoint_step()

    def _checkpoint_step(self) -> int:
        return self.state_step if self.policy is not None and self.policy.path == "gradient" else self.progress

    def _maybe_capture(self, previous_step: int) -> None:
        """Captures a checkpoint snapshot when the step crossed a multiple of ``checkpoint_every_steps`` (lock held).

        On the gradient path every PS task sees the same state steps, so the
        snapshots of all tasks at one multiple form a consistent cut.
        """
        step = self._checkpoint_step()
        k = self.checkpoint_every_steps
        if (k and step // k > previous_step // k) or step in self._capture_at:
            self._captured.append(self._checkpoint_state_locked())
        self._capture_at = {s for s in self._capture_at if s > step}

    def capture_at(self, worker: int, step: int) -> bool:
        """Gradient path: capture a snapshot when the state reaches ``step``; False if it is already past it."""
        with self._cond:
            self._check_member(worker)
            self._require_initialized()
            if self.state_step > step:
                return False
            if self.state_step == step:
                self._captured.append(self._checkpoint_state_locked())
            else:
                self._capture_at.add(step)
            return True

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

        Kept: values, specs, versions, steps, the policy and its state (SSP
        clocks, DTSSP's bound and loss windows), membership (done, left,
        excluded, draining workers), the job's batch counters. Not kept: a
        gradient-path step in progress (its gradients are sent again) and
        liveness times (a restored task gives every worker a fresh start-up
        grace).
        """
        with self._cond:
            if not self.initialized:
                return None
            return self._checkpoint_state_locked()

    def _checkpoint_state_locked(self) -> tuple[int, dict[str, Any], dict[str, np.ndarray]]:
        meta = {
            "kind": "tfdist-ps-shard",
            "specs": [sp.to_dict() for sp in self._specs.values()],
            "policy": self.policy.spec(),
            "policy_state": self.policy.state(),
            "path": self.policy.path,
            "nonfinite": self.nonfinite,
            "num_workers": self.num_workers,
            "version": self.version,
            "initialized_by": self.initialized_by,
            "global_step": self.global_step,
            "state_step": self.state_step,
            "done_workers": sorted(self.done_workers),
            "left_workers": sorted(self.left_workers),
            "excluded": sorted(self.excluded),
            "draining": sorted(self.draining),
            "total_batches": self.total_batches,
            "worker_batches": {str(w): n for w, n in self.worker_batches.items()},
            "progress": self.progress,
            "joins": self.joins,
            "incarnation": self.incarnation,
            "tables": [{**TableShard(t.spec, t.shard, t.num_shards).to_dict(), "updates": t.updates}
                       for t in self._tables.values()],
        }
        values = {k: v.copy() for k, v in self._values.items()}
        values.update(self._table_arrays_locked())
        return self._checkpoint_step(), meta, values

    def restore(self, meta: Mapping[str, Any], values: Mapping[str, np.ndarray], replace: bool = False) -> None:
        """Loads a checkpoint written from :meth:`checkpoint_state`.

        Args:
            replace: Roll an initialised store back (the gradient path's
                recovery); it takes a new incarnation. Defaults to ``False``:
                only a store that holds no values yet may restore.

        Raises:
            StoreError: the store already holds values (without ``replace``),
                or the checkpoint does not fit (missing values, wrong dtype or
                shape, another job's worker count or variables); nothing is
                changed then.
        """
        try:
            if meta.get("kind") != "tfdist-ps-shard":
                raise ValueError(f"kind {meta.get('kind')!r}")
            specs = [VariableSpec.from_dict(d) for d in meta["specs"]]
            int(meta["version"]), int(meta["state_step"]), int(meta["initialized_by"]), meta["policy"]
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise StoreError(f"Not a checkpoint of a parameter-server shard ({short(str(e))}).",
                             grpc_code="DATA_LOSS") from None
        num_workers = meta.get("num_workers")
        with self._cond:
            if self.initialized and not replace:
                raise StoreError("A checkpoint is restored only into a parameter server that holds no values yet.",
                                 grpc_code="FAILED_PRECONDITION")
            if self.initialized:
                self._check_same_specs(specs)
            if self.num_workers is not None and num_workers is not None and num_workers != self.num_workers:
                raise StoreError(
                    f"The checkpoint is of a job with {num_workers} workers; this one has {self.num_workers}. "
                    "Use another ps.checkpoint_dir for a job of another size.", grpc_code="FAILED_PRECONDITION")
            tables = {}
            for d in meta.get("tables") or ():
                shard = _table_shard("checkpoint", {k: v for k, v in d.items() if k != "updates"})
                table = Table(shard.spec, shard.shard, shard.num_shards)
                prefix = f"table/{shard.spec.key}/"
                arrays = {k[len(prefix):]: v for k, v in values.items() if k.startswith(prefix)}
                if set(arrays) != set(table.arrays()) or arrays["values"].shape != table.values.shape:
                    raise StoreError(f"The checkpoint's table {short(shard.spec.key)} is incomplete or of another "
                                     "shape.", grpc_code="DATA_LOSS")
                table.load(arrays, int(d.get("updates", 0)))
                tables[shard.spec.key] = table
            missing = [sp.key for sp in specs if sp.key not in values]
            wrong = [sp.key for sp in specs if sp.key in values and (
                values[sp.key].dtype.name != sp.dtype or tuple(values[sp.key].shape) != tuple(sp.shape))]
            if missing or wrong:
                raise StoreError(f"The checkpoint does not match its own variable list (missing: "
                                 f"{short(missing[:4])}, wrong dtype/shape: {short(wrong[:4])}).",
                                 grpc_code="DATA_LOSS")
            policy = policy_from_spec(meta["policy"], num_workers or 1)
            policy.restore(meta.get("policy_state") or {})
            # -- every check passed: apply
            self.policy = policy
            if self.num_workers is None:
                self.num_workers = num_workers
            self.nonfinite = meta.get("nonfinite", "refuse")
            self._specs = {sp.key: sp for sp in specs}
            self._values = {sp.key: np.array(values[sp.key], copy=True) for sp in specs}
            self._tables = tables
            self.version = int(meta["version"])
            self.global_step = self.state_step = int(meta["state_step"])
            self.initialized_by = int(meta["initialized_by"])
            self.done_workers = set(meta.get("done_workers", ()))
            self.left_workers = set(meta.get("left_workers", ()))
            self.excluded = set(meta.get("excluded", ()))
            self.draining = set(meta.get("draining", ()))
            self.total_batches = meta.get("total_batches")
            self.worker_batches = {int(w): int(n) for w, n in (meta.get("worker_batches") or {}).items()}
            self.progress = int(meta.get("progress", 0))
            self.joins = int(meta.get("joins", 0))
            self._acc, self._contributors, self._history, self._sparse_acc = {}, set(), {}, {}
            if replace:
                self.incarnation = secrets.randbits(48)
            # Every worker not done gets a fresh start-up grace: they reconnect to this task now.
            self._init_time = self._time()
            self._expected = set(range(self.num_workers or 0)) - self.done_workers
            self._last_seen, self._ever_seen = {}, set()
            self.restored_from = self._checkpoint_step()
            self.policy.on_step_boundary(self._ctx())
            self._cond.notify_all()
        logger.info("restored from the checkpoint of step %d: %d variables, policy %s, version %d",
                    self.restored_from, len(specs), self.policy.spec(), self.version)

    def status(self, brief: bool = False) -> dict[str, Any]:
        """Counters, membership and policy of this PS.

        Args:
            brief: Leave out ``specs`` (one entry per variable), for pollers
                that read only the counters, like the elastic engine.
                Defaults to ``False``.
        """
        with self._cond:
            status = {
                "initialized": self.initialized,
                "initialized_by": self.initialized_by,
                "version": self.version,
                "global_step": self.global_step,
                "state_step": self.state_step,
                "num_variables": len(self._values),
                "bytes": int(sum(v.nbytes for v in self._values.values())),
                "tables": {k: {"rows": t.num_rows, "dim": t.spec.dim, "shard": t.shard, "num_shards": t.num_shards,
                               "updates": t.updates, "optimizer": t.optimizer.kind,
                               "bytes": int(sum(a.nbytes for a in t.arrays().values()))}
                           for k, t in self._tables.items()},
                "live_workers": sorted(self._live()),
                "done_workers": sorted(self.done_workers),
                "left_workers": sorted(self.left_workers),
                "excluded": sorted(self.excluded),
                "draining": sorted(self.draining),
                "worker_batches": {str(w): n for w, n in sorted(self.worker_batches.items())},
                "progress": self.progress,
                "total_batches": self.total_batches,
                "job_done": self.job_done,
                "joins": self.joins,
                "nonfinite": self.nonfinite,
                "incarnation": self.incarnation,
                "restored_from": self.restored_from,
                "stats": dict(self.stats),
                "policy": self.policy.describe() if self.policy else None,
            }
            if not brief:
                status["specs"] = [s.to_dict() for s in self._specs.values()]
            return status


class _Wait:
    """A wait/go answer in the shape ``_wait_for`` reads."""

    __slots__ = ("action", "reason")

    def __init__(self, wait: bool, reason: str):
        self.action = PushAction.WAIT if wait else PushAction.APPLY
        self.reason = reason
