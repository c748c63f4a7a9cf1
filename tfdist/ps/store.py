"""The parameter store of one PS task: values, validation, policy and liveness.

No sockets here: the gRPC server (``tfdist.ps.server``) decodes requests and
calls these methods, which makes the store testable in-process. Every
mutation validates the whole request first and then applies all of it under
one lock, so a rejected request leaves the values exactly as they were.

Two exchange paths (see :mod:`tfdist.consistency.base`):

* update path — :meth:`push` adds deltas, :meth:`read` serves values once
  the policy lets the reader start its clock;
* gradient path — :meth:`push_gradients` accumulates gradients for the
  current global step, completes the step when the policy says so, and
  answers every contributor (and late, dropped ones) with the step's
  aggregate; :meth:`put_state` / :meth:`read` keep the canonical state
  snapshot (weights, optimizer slots, counters) for workers that resync.

Membership: a worker is live while it heart-beats within the timeout and has
not said it is done. Workers the job expects but that have not appeared yet
count as live (clock 0) for ``startup_grace_s`` after initialisation, so the
first steps wait for a slow starter instead of racing ahead.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from tfdist.consistency.base import ConsistencyPolicy, GradientAction, PolicyContext, PushAction
from tfdist.errors import PSRejectedError
from tfdist.ps.placement import VariableSpec

__all__ = ["ParameterStore", "StoreError"]

logger = logging.getLogger(__name__)

#: Completed steps whose aggregates are kept for workers that arrive late.
AGGREGATE_HISTORY = 8


class StoreError(PSRejectedError):
    """A request the store refuses; ``grpc_code`` names the gRPC status."""

    grpc_code = "INVALID_ARGUMENT"

    def __init__(self, message: str, grpc_code: str | None = None):
        super().__init__(message)
        if grpc_code:
            self.grpc_code = grpc_code


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
        heartbeat_timeout_s: float = 30.0,
        startup_grace_s: float = 120.0,
        time_fn: Callable[[], float] = time.monotonic,
        max_updates_per_s: float | None = None,
    ):
        self.policy = policy
        self.max_updates_per_s = max_updates_per_s
        self._next_slot = 0.0
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.startup_grace_s = startup_grace_s
        self._time = time_fn
        self._cond = threading.Condition()
        self._values: dict[str, np.ndarray] = {}
        self._specs: dict[str, VariableSpec] = {}
        self.version = 0
        self.initialized_by: int | None = None
        self._init_time = 0.0
        self._expected: set[int] = set()
        self._last_seen: dict[int, float] = {}
        self._ever_seen: set[int] = set()
        self.done_workers: set[int] = set()
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
        self.stats = {
            "pushes": 0, "pulls": 0, "dropped": 0, "rejected": 0, "bytes_in": 0, "bytes_out": 0,
            "waits": 0, "aggregations": 0, "gradients_aggregated": 0, "state_writes": 0,
        }

    # ---------------------------------------------------------------- init
    @property
    def initialized(self) -> bool:
        return self.initialized_by is not None

    def init(
        self,
        worker: int,
        specs: list[VariableSpec],
        values: Mapping[str, np.ndarray],
        policy: ConsistencyPolicy | None = None,
        num_workers: int | None = None,
        step: int = 0,
    ) -> bool:
        """Stores the initial values (and policy) unless already initialised.

        Returns:
            True if this call initialised the store; False if it already was
            (the caller should then pull). Specs and policy are checked
            either way.
        """
        self._validate_specs(specs, values)
        with self._cond:
            self.done_workers.discard(worker)
            self._touch(worker)
            if self.initialized:
                self._check_same_specs(specs)
                self._check_same_policy(policy)
                return False
            if policy is not None:
                self.policy = policy
            if self.policy is None:
                raise StoreError("No consistency policy: the initialising worker must send one.")
            self._specs = {s.key: s for s in specs}
            self._values = {s.key: np.array(values[s.key], dtype=values[s.key].dtype, copy=True) for s in specs}
            self.version = 1
            self.global_step = self.state_step = step
            self.initialized_by = worker
            self._init_time = self._time()
            self._expected = set(range(num_workers or 0))
            self.policy.on_step_boundary(self._ctx())
            self._cond.notify_all()
        total = sum(s.nbytes for s in specs)
        logger.info("initialised by worker %d: %d variables, %d bytes, policy %s",
                    worker, len(specs), total, self.policy.spec())
        return True

    def wait_initialized(self, timeout: float) -> bool:
        """Blocks until initialised or ``timeout`` seconds pass."""
        with self._cond:
            return self._cond.wait_for(lambda: self.initialized, timeout=max(timeout, 0.0))

    def specs(self) -> list[VariableSpec]:
        with self._cond:
            return list(self._specs.values())

    def check_compatible(self, specs: list[VariableSpec], policy: ConsistencyPolicy | None) -> None:
        """Raises if ``specs`` or the policy differ from what the store holds."""
        with self._cond:
            self._check_same_specs(specs)
            self._check_same_policy(policy)

    @staticmethod
    def _validate_specs(specs: list[VariableSpec], values: Mapping[str, np.ndarray]) -> None:
        keys = [s.key for s in specs]
        if len(set(keys)) != len(keys):
            raise StoreError(f"Duplicate variable keys in init: {sorted(k for k in set(keys) if keys.count(k) > 1)}.")
        if set(keys) != set(values):
            missing = sorted(set(keys) - set(values))
            extra = sorted(set(values) - set(keys))
            raise StoreError(f"Init values do not match specs: missing {missing}, unexpected {extra}.")
        for s in specs:
            v = values[s.key]
            if v.dtype.name != s.dtype or tuple(v.shape) != tuple(s.shape):
                raise StoreError(
                    f"Init value of {s.key!r} is {v.dtype.name}{list(v.shape)}, spec says {s.dtype}{list(s.shape)}."
                )

    def _check_same_specs(self, specs: list[VariableSpec]) -> None:
        theirs = {s.key: s for s in specs}
        if theirs != self._specs:
            diff = sorted(
                (k, f"{s.dtype}{list(s.shape)}") for k, s in set(theirs.items()) ^ set(self._specs.items())
            )[:4]
            raise StoreError(
                "This worker's variables differ from the ones the parameter servers "
                f"were initialised with (first differences: {diff}). Every worker must "
                "build the same model, creating variables in the same order.",
                grpc_code="FAILED_PRECONDITION",
            )

    def _check_same_policy(self, policy: ConsistencyPolicy | None) -> None:
        if policy is not None and self.policy is not None and policy.spec() != self.policy.spec():
            raise StoreError(
                f"This worker uses consistency {policy.spec()}, but the job runs {self.policy.spec()} "
                "(chosen by the chief). Use the same strategy settings on every worker.",
                grpc_code="FAILED_PRECONDITION",
            )

    # ------------------------------------------------------------ validation
    def _require_initialized(self) -> None:
        if not self.initialized:
            raise StoreError(
                "The parameter server has no variables yet: the chief (or worker 0) "
                "initialises them at its first step.",
                grpc_code="FAILED_PRECONDITION",
            )

    def _validate_keys(self, keys: Iterable[str]) -> None:
        unknown = [k for k in keys if k not in self._values]
        if unknown:
            known = list(self._values)[:8]
            raise StoreError(
                f"Unknown variable(s) {unknown[:8]} on this parameter server. "
                f"It holds {len(self._values)} variables, e.g. {known}.",
                grpc_code="NOT_FOUND",
            )

    def _validate_tensors(self, tensors: Mapping[str, np.ndarray], trainable_only: bool = False) -> None:
        self._validate_keys(tensors)
        for key, value in tensors.items():
            spec = self._specs[key]
            if trainable_only and not spec.trainable:
                raise StoreError(f"{key!r} is not trainable: gradients cannot be pushed for it.")
            if value.dtype.name != spec.dtype:
                raise StoreError(
                    f"Wrong dtype for {key!r}: received {value.dtype.name}, the variable is {spec.dtype}."
                )
            if tuple(value.shape) != tuple(spec.shape):
                raise StoreError(
                    f"Wrong shape for {key!r}: received {list(value.shape)}, the variable is {list(spec.shape)}."
                )

    def _checked(self, check: Callable[[], None]) -> None:
        try:
            self._require_initialized()
            check()
        except StoreError:
            self.stats["rejected"] += 1
            raise

    def _require_path(self, path: str) -> None:
        if self.policy.path != path:
            raise StoreError(
                f"This job runs {self.policy.name!r} ({self.policy.path} path); a {path}-path request "
                "does not apply. Use the same strategy on every worker.",
                grpc_code="FAILED_PRECONDITION",
            )

    # ----------------------------------------------------------- update path
    def push(
        self,
        worker: int,
        clock: int,
        deltas: Mapping[str, np.ndarray],
        timeout: float | None = None,
        loss: float | None = None,
        steps: int = 1,
    ) -> dict[str, Any]:
        """Adds ``deltas`` to the stored values, as the policy decides.

        ``clock`` is the number of steps the worker has completed with this
        push. ``steps`` is how many local steps (batches) the deltas sum up
        (``strategy.exchange_every``); the job's batch counters advance by it.
        All deltas are validated before any is applied.
        """
        with self._cond:
            self._touch(worker)
            self._checked(lambda: (self._require_path("update"), self._validate_tensors(deltas),
                                   self._validate_steps(steps)))
            self._admit(timeout)
            decision = self._wait_for(lambda: self.policy.on_push(worker, clock, self._ctx()), timeout, "push")
            self._count_batch(worker, steps)
            if decision.action is PushAction.DROP:
                self.stats["dropped"] += 1
                return {"applied": False, "dropped": True, "version": self.version, "reason": decision.reason,
                        **self._member_info(worker)}
            for key, delta in deltas.items():
                self._values[key] += delta
                self.stats["bytes_in"] += delta.nbytes
            previous = self.version
            self.version += 1
            self.stats["pushes"] += 1
            self.progress += steps
            self.policy.on_applied(worker, clock, self._ctx(), loss)
            self._cond.notify_all()
            return {"applied": True, "dropped": False, "version": self.version, "previous_version": previous,
                    **self._clock_info(), **self._member_info(worker)}

    def _clock_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"global_step": self.global_step}
        if hasattr(self.policy, "min_clock"):
            info["min_clock"] = self.policy.min_clock(self._ctx())
            s = self.policy.staleness
            info["staleness"] = None if s == float("inf") else int(s)
        return info

    def read(
        self,
        worker: int,
        clock: int,
        keys: Iterable[str] | None,
        consumer: Callable[[dict[str, Any], dict[str, np.ndarray]], Any],
        timeout: float | None = None,
        min_state_step: int | None = None,
    ) -> Any:
        """Calls ``consumer(meta, values)`` with the lock held, once readable.

        On the update path the policy decides whether a worker about to start
        ``clock`` may read now; on the gradient path ``min_state_step`` waits
        for a state snapshot at least that recent. ``values`` are the live
        arrays: the consumer must copy what it keeps (encoding does).
        """
        with self._cond:
            self._touch(worker)
            self._checked(lambda: self._validate_keys(self._values if keys is None else keys))
            keys = list(self._values) if keys is None else list(keys)
            if self.policy.path == "update":
                self._wait_for(lambda: self._pull_decision(worker, clock), timeout, "pull")
            elif min_state_step is not None:
                self._wait_for(lambda: _Wait(self.state_step < min_state_step,
                                             f"state snapshot of step {min_state_step} not written yet"),
                               timeout, "read the state")
            values = {k: self._values[k] for k in keys}
            self.stats["pulls"] += 1
            self.stats["bytes_out"] += sum(v.nbytes for v in values.values())
            meta = {"version": self.version, "state_step": self.state_step, **self._clock_info(),
                    **self._member_info(worker)}
            if worker >= 0 and hasattr(self.policy, "clock_of"):
                meta["clock"] = self.policy.clock_of(worker)
            return consumer(meta, values)

    def _pull_decision(self, worker: int, clock: int):
        decision = self.policy.on_pull(worker, clock, self._ctx())
        return _Wait(decision.wait, decision.reason)

    # --------------------------------------------------------- gradient path
    def push_gradients(
        self,
        worker: int,
        step: int,
        grads: Mapping[str, np.ndarray],
        timeout: float | None = None,
    ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """Contributes ``grads`` to global step ``step``; returns that step's aggregate.

        Blocks (bounded) until the step is complete. A gradient for a step
        that is already complete is dropped; its sender still gets the
        step's aggregate if it is in the recent history, otherwise
        ``resync=True`` (it must reload the state snapshot).

        Returns:
            ``(meta, aggregate)``; ``meta`` has ``dropped``, ``resync``,
            ``global_step``, ``write_state`` (this worker completed the step
            and should upload the state after applying it).
        """
        with self._cond:
            self._touch(worker)
            self._checked(lambda: (self._require_path("gradient"), self._validate_tensors(grads, trainable_only=True)))
            self._admit(timeout)
            decision = self.policy.on_gradient(worker, step, self.global_step, frozenset(self._contributors), self._ctx())
            if decision.action in (GradientAction.FUTURE, GradientAction.DUPLICATE):
                self.stats["rejected"] += 1
                raise StoreError(f"Gradient refused: {decision.reason}.", grpc_code="FAILED_PRECONDITION")
            dropped = decision.action is GradientAction.STALE
            self._count_batch(worker)
            if dropped:
                self.stats["dropped"] += 1
            else:
                for key, g in grads.items():
                    if key in self._acc:
                        self._acc[key] += g
                    else:
                        self._acc[key] = np.array(g, copy=True)
                    self.stats["bytes_in"] += g.nbytes
                self._contributors.add(worker)
                self._maybe_complete(worker)
                if self.global_step <= step:
                    self.stats["waits"] += 1
                self._wait_for(lambda: self._step_wait(step), timeout, f"complete step {step}")
            meta = {"dropped": dropped, "global_step": self.global_step, "step": step, "reason": decision.reason,
                    **self._member_info(worker)}
            if step not in self._history:
                return {**meta, "resync": True, "write_state": False}, {}
            aggregate, closer = self._history[step]
            self.stats["bytes_out"] += sum(a.nbytes for a in aggregate.values())
            return {**meta, "resync": False, "write_state": closer == worker and not dropped}, aggregate

    def _step_wait(self, step: int):
        if self.global_step > step:
            return _Wait(False, "")
        self._maybe_complete(None)  # the live set may have shrunk
        return _Wait(self.global_step <= step,
                     f"step {step} has {len(self._contributors)} gradient(s); the policy waits for more")

    def _maybe_complete(self, closer: int | None) -> None:
        contributors = frozenset(self._contributors)
        if not contributors or not self.policy.step_complete(contributors, self._ctx()):
            return
        m = getattr(self.policy, "replicas_to_aggregate", len(contributors))
        if len(contributors) != m:  # Keras scaled every loss by 1/m: make the sum the mean
            for value in self._acc.values():
                value *= np.asarray(m / len(contributors), dtype=value.dtype)
        step = self.global_step
        self._history[step] = (self._acc, closer if closer is not None else min(contributors))
        for old in [s for s in self._history if s <= step - AGGREGATE_HISTORY]:
            del self._history[old]
        self.stats["aggregations"] += 1
        self.stats["gradients_aggregated"] += len(contributors)
        self.progress += len(contributors)
        self._acc, self._contributors = {}, set()
        self.global_step = step + 1
        self.policy.on_step_boundary(self._ctx())
        self._cond.notify_all()

    def put_state(self, worker: int, step: int, tensors: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """Replaces the state snapshot with the one a worker had after ``step`` steps.

        Older snapshots than the stored one are ignored; keys must be known.
        """
        with self._cond:
            self._touch(worker)
            self._checked(lambda: self._validate_tensors(tensors))
            if step <= self.state_step and self.state_step > 0:
                return {"stored": False, "state_step": self.state_step}
            for key, value in tensors.items():
                np.copyto(self._values[key], value)
            self.state_step = step
            self.version += 1
            self.stats["state_writes"] += 1
            self._cond.notify_all()
            return {"stored": True, "state_step": self.state_step}

    # ---------------------------------------------------------------- waits
    def _wait_for(self, decide, timeout: float | None, what: str):
        """Re-asks ``decide`` until it does not say WAIT, within ``timeout``."""
        deadline = None if timeout is None else self._time() + timeout
        counted = False
        while True:
            decision = decide()
            if decision.action is not PushAction.WAIT:
                return decision
            if not counted and what == "pull":
                self.stats["waits"] += 1
                counted = True
            remaining = None if deadline is None else deadline - self._time()
            if remaining is not None and remaining <= 0:
                raise StoreError(
                    f"Timed out waiting to {what}: {decision.reason or 'the consistency policy said wait'}. "
                    "Raise ps.rpc_timeout_s if workers are expected to lag this much.",
                    grpc_code="DEADLINE_EXCEEDED",
                )
            # Re-check at least every 0.2 s: liveness changes by the passage of time.
            self._cond.wait(timeout=min(remaining, 0.2) if remaining is not None else 0.2)

    # ------------------------------------------------------------ capacity
    def _admit(self, timeout: float | None) -> None:
        """Waits for this update's slot when ``max_updates_per_s`` caps the rate (lock released while waiting)."""
        if not self.max_updates_per_s:
            return
        now = self._time()
        slot = max(now, self._next_slot)
        self._next_slot = slot + 1.0 / self.max_updates_per_s
        deadline = None if timeout is None else now + timeout
        while (remaining := slot - self._time()) > 0:
            if deadline is not None and self._time() >= deadline:
                raise StoreError("Timed out waiting for a slot of the PS's capacity (ps.max_updates_per_s).",
                                 grpc_code="DEADLINE_EXCEEDED")
            self._cond.wait(timeout=remaining)

    # ------------------------------------------------------------ membership
    def _count_batch(self, worker: int, steps: int = 1) -> None:
        if worker >= 0:
            self.worker_batches[worker] = self.worker_batches.get(worker, 0) + steps

    @staticmethod
    def _validate_steps(steps: Any) -> None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise StoreError(f"A push must sum up at least one step; received steps={steps!r}.")

    def _member_info(self, worker: int) -> dict[str, Any]:
        info: dict[str, Any] = {}
        if worker in self.draining:
            info["leave"] = True
        if self.job_done:
            info["job_done"] = True
        return info

    @property
    def job_done(self) -> bool:
        return self.total_batches is not None and self.progress >= self.total_batches

    def control(self, drain: Iterable[int] | None = None, undrain: Iterable[int] | None = None,
                total_batches: int | None = None, gone: Iterable[int] | None = None) -> dict[str, Any]:
        """Engine → PS: ask workers to leave, take that back, set the job's work,
        or report workers ``gone`` (their process ended: stop waiting for them now,
        not after the heart-beat timeout)."""
        with self._cond:
            if total_batches is not None and int(total_batches) < 1:
                raise StoreError(f"total_batches must be >= 1. Received: total_batches={total_batches!r}.")
            for w in gone or ():
                self.done_workers.add(int(w))
                self._last_seen.pop(int(w), None)
                self.draining.discard(int(w))
            if drain:
                self.draining |= {int(w) for w in drain}
                logger.info("workers asked to leave: %s", sorted(self.draining))
            if undrain:
                self.draining -= {int(w) for w in undrain}
            if total_batches is not None:
                self.total_batches = int(total_batches)
            self._cond.notify_all()
            return {"draining": sorted(self.draining), "total_batches": self.total_batches,
                    "progress": self.progress, "job_done": self.job_done}

    def rejoin(self, worker: int) -> None:
        """A worker (re)starts a session: it may come back after it said ``Done``."""
        with self._cond:
            if worker >= 0:
                self.done_workers.discard(worker)
                self.draining.discard(worker)

    # ------------------------------------------------------------ liveness
    def _touch(self, worker: int) -> None:
        if worker < 0 or worker in self.done_workers:
            return
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
            live |= {w for w in self._expected if w not in self._last_seen and w not in self.done_workers}
        return frozenset(live)

    def _ctx(self) -> PolicyContext:
        live = self._live()
        return PolicyContext(self._time(), live, frozenset(self.excluded & live))

    def set_excluded(self, worker: int, excluded: Iterable[int]) -> list[int]:
        """Replaces the set of detected stragglers barriers do not wait for."""
        with self._cond:
            self._touch(worker)
            new = {int(w) for w in excluded}
            if new != self.excluded:
                logger.info("stragglers excluded from barriers: %s (reported by worker %d)", sorted(new), worker)
            self.excluded = new
            self._cond.notify_all()
            return sorted(self.excluded)

    def heartbeat(self, worker: int) -> list[int]:
        with self._cond:
            self._touch(worker)
            self._cond.notify_all()
            return sorted(self._live())

    def mark_done(self, worker: int) -> set[int]:
        with self._cond:
            self.done_workers.add(worker)
            self._last_seen.pop(worker, None)
            self._cond.notify_all()
            return set(self.done_workers)

    def live_workers(self) -> list[int]:
        with self._cond:
            return sorted(self._live())

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
                "live_workers": sorted(self._live()),
                "done_workers": sorted(self.done_workers),
                "excluded": sorted(self.excluded),
                "draining": sorted(self.draining),
                "worker_batches": {str(w): n for w, n in sorted(self.worker_batches.items())},
                "progress": self.progress,
                "total_batches": self.total_batches,
                "job_done": self.job_done,
                "joins": self.joins,
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
