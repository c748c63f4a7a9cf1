"""The parameter store of one PS task: values, validation, policy and liveness.

No sockets here: the gRPC server (``tfdist.ps.server``) decodes requests and
calls these methods, which makes the store testable in-process. Every
mutation validates the whole request first and then applies all of it under
one lock, so a rejected request leaves the values exactly as they were.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from tfdist.consistency.base import ConsistencyPolicy, PushAction
from tfdist.errors import PSRejectedError
from tfdist.ps.placement import VariableSpec

__all__ = ["ParameterStore", "StoreError", "PushResult"]

logger = logging.getLogger(__name__)


class StoreError(PSRejectedError):
    """A request the store refuses; ``grpc_code`` names the gRPC status."""

    grpc_code = "INVALID_ARGUMENT"

    def __init__(self, message: str, grpc_code: str | None = None):
        super().__init__(message)
        if grpc_code:
            self.grpc_code = grpc_code


class PushResult(dict):
    """``{"applied": bool, "dropped": bool, "version": int}``."""


class ParameterStore:
    """Variables owned by one PS task, guarded by one condition variable.

    Args:
        policy: The consistency policy consulted on every push and pull.
        heartbeat_timeout_s: A worker not heard from for this long is not live.
        time_fn: Monotonic clock; tests pass a fake one.
    """

    def __init__(
        self,
        policy: ConsistencyPolicy,
        heartbeat_timeout_s: float = 30.0,
        time_fn: Callable[[], float] = time.monotonic,
    ):
        self.policy = policy
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self._time = time_fn
        self._cond = threading.Condition()
        self._values: dict[str, np.ndarray] = {}
        self._specs: dict[str, VariableSpec] = {}
        self.version = 0
        self.initialized_by: int | None = None
        self._last_seen: dict[int, float] = {}
        self.done_workers: set[int] = set()
        self.stats = {"pushes": 0, "pulls": 0, "dropped": 0, "rejected": 0, "bytes_in": 0, "bytes_out": 0}

    # ---------------------------------------------------------------- init
    @property
    def initialized(self) -> bool:
        return self.initialized_by is not None

    def init(self, worker: int, specs: list[VariableSpec], values: Mapping[str, np.ndarray]) -> bool:
        """Stores the initial values unless another worker already did.

        Returns:
            True if this call initialised the store; False if it already was
            (the caller should then pull). Specs are checked either way.
        """
        self._validate_specs(specs, values)
        with self._cond:
            self._touch(worker)
            if self.initialized:
                self._check_same_specs(specs)
                return False
            self._specs = {s.key: s for s in specs}
            self._values = {s.key: np.array(values[s.key], dtype=s.dtype, copy=True) for s in specs}
            self.version = 1
            self.initialized_by = worker
            self._cond.notify_all()
        total = sum(s.nbytes for s in specs)
        logger.info("initialised by worker %d: %d variables, %d bytes", worker, len(specs), total)
        return True

    def wait_initialized(self, timeout: float) -> bool:
        """Blocks until initialised or ``timeout`` seconds pass."""
        with self._cond:
            return self._cond.wait_for(lambda: self.initialized, timeout=max(timeout, 0.0))

    def specs(self) -> list[VariableSpec]:
        with self._cond:
            return list(self._specs.values())

    def check_specs(self, specs: list[VariableSpec]) -> None:
        """Raises if ``specs`` differ from what the store holds."""
        with self._cond:
            self._check_same_specs(specs)

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

    def _validate_deltas(self, deltas: Mapping[str, np.ndarray]) -> None:
        self._validate_keys(deltas)
        for key, delta in deltas.items():
            spec = self._specs[key]
            if delta.dtype.name != spec.dtype:
                raise StoreError(
                    f"Wrong dtype for {key!r}: received {delta.dtype.name}, the variable is {spec.dtype}."
                )
            if tuple(delta.shape) != tuple(spec.shape):
                raise StoreError(
                    f"Wrong shape for {key!r}: received {list(delta.shape)}, the variable is {list(spec.shape)}."
                )

    # ----------------------------------------------------------- push / pull
    def push(
        self,
        worker: int,
        clock: int,
        deltas: Mapping[str, np.ndarray],
        timeout: float | None = None,
    ) -> PushResult:
        """Adds ``deltas`` to the stored values, as the policy decides.

        All deltas are validated before any is applied.
        """
        with self._cond:
            self._touch(worker)
            try:
                self._require_initialized()
                self._validate_deltas(deltas)
            except StoreError:
                self.stats["rejected"] += 1
                raise
            decision = self._wait_for(lambda: self.policy.on_push(worker, clock, self._time()), timeout, "push")
            if decision.action is PushAction.DROP:
                self.stats["dropped"] += 1
                return PushResult(applied=False, dropped=True, version=self.version, reason=decision.reason)
            for key, delta in deltas.items():
                self._values[key] += delta
                self.stats["bytes_in"] += delta.nbytes
            self.version += 1
            self.stats["pushes"] += 1
            self.policy.on_applied(worker, clock, self._time())
            self._cond.notify_all()
            return PushResult(applied=True, dropped=False, version=self.version)

    def read(
        self,
        worker: int,
        clock: int,
        keys: Iterable[str] | None,
        consumer: Callable[[int, dict[str, np.ndarray]], Any],
        timeout: float | None = None,
    ) -> Any:
        """Calls ``consumer(version, values)`` with the lock held.

        ``values`` are the live arrays: the consumer must copy what it keeps
        (encoding into a message does). Returns what the consumer returns.
        """
        with self._cond:
            self._touch(worker)
            self._require_initialized()
            keys = list(self._values) if keys is None else list(keys)
            try:
                self._validate_keys(keys)
            except StoreError:
                self.stats["rejected"] += 1
                raise
            self._wait_for(lambda: self._pull_decision(worker, clock), timeout, "pull")
            values = {k: self._values[k] for k in keys}
            self.stats["pulls"] += 1
            self.stats["bytes_out"] += sum(v.nbytes for v in values.values())
            return consumer(self.version, values)

    def _pull_decision(self, worker: int, clock: int):
        decision = self.policy.on_pull(worker, clock, self._time())
        return _AsPush(decision.wait, decision.reason)

    def _wait_for(self, decide, timeout: float | None, what: str):
        """Re-asks ``decide`` until it does not say WAIT, within ``timeout``."""
        deadline = None if timeout is None else self._time() + timeout
        while True:
            decision = decide()
            if decision.action is not PushAction.WAIT:
                return decision
            remaining = None if deadline is None else deadline - self._time()
            if remaining is not None and remaining <= 0:
                raise StoreError(
                    f"Timed out waiting to {what}: {decision.reason or 'the consistency policy said wait'}. "
                    "Raise ps.rpc_timeout_s if workers are expected to lag this much.",
                    grpc_code="DEADLINE_EXCEEDED",
                )
            self._cond.wait(timeout=min(remaining, 1.0) if remaining is not None else 1.0)

    # ------------------------------------------------------------ liveness
    def _touch(self, worker: int) -> None:
        if worker >= 0:
            self._last_seen[worker] = self._time()

    def heartbeat(self, worker: int) -> list[int]:
        with self._cond:
            self._touch(worker)
            self._cond.notify_all()
            return self._live()

    def mark_done(self, worker: int) -> set[int]:
        with self._cond:
            self.done_workers.add(worker)
            self._last_seen.pop(worker, None)
            self._cond.notify_all()
            return set(self.done_workers)

    def _live(self) -> list[int]:
        now = self._time()
        return sorted(w for w, t in self._last_seen.items() if now - t <= self.heartbeat_timeout_s)

    def live_workers(self) -> list[int]:
        with self._cond:
            return self._live()

    def status(self) -> dict[str, Any]:
        with self._cond:
            return {
                "initialized": self.initialized,
                "initialized_by": self.initialized_by,
                "version": self.version,
                "num_variables": len(self._values),
                "bytes": int(sum(v.nbytes for v in self._values.values())),
                "live_workers": self._live(),
                "done_workers": sorted(self.done_workers),
                "stats": dict(self.stats),
                "policy": self.policy.describe(),
                "specs": [s.to_dict() for s in self._specs.values()],
            }


class _AsPush:
    """Adapts a pull decision to the push-decision shape ``_wait_for`` reads."""

    __slots__ = ("action", "reason")

    def __init__(self, wait: bool, reason: str):
        self.action = PushAction.WAIT if wait else PushAction.APPLY
        self.reason = reason
